"""Pruning a cache: plan what goes, then apply the plan in one write transaction.

Criteria combine, applied in this order:
1. `drop_corrupt`: trees whose record fails its checksum or does not decode;
2. `older_than`: trees last accessed (wall clock) more than that many seconds ago;
3. `min_count`: decay every remaining tree to now and drop its nodes whose count is below
   X (trees left empty go too) -- the only criterion that decompresses trees;
4. `max_trees` / `max_bytes`: evict least recently used trees (by last access) until at
   most N trees / N bytes of stored records remain.

`plan_prune` changes nothing (that is `--dry-run`); `apply_prune` deletes the planned trees
and re-does the trimming inside its transaction, so counts a concurrent writer committed
after planning are trimmed by the same rule, not lost. The data file does not shrink until
it is compacted (cache_store.transfer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import lmdb

from cache_store import env as envmod
from cache_store.clock import decay_factor
from cache_store.codec import META_BYTES, MetaRecord, RecordHeader, decode_record, encode_record
from cache_store.errors import CorruptRecord
from cache_store.store import CacheStore
from cache_store.trie import TokenTree


@dataclass
class PruneCriteria:
    """What `srt cache prune` was asked to do (None = not used)."""

    max_bytes: int | None = None
    max_trees: int | None = None
    older_than: float | None = None  # seconds
    min_count: float | None = None
    drop_corrupt: bool = False

    def any(self) -> bool:
        return self.drop_corrupt or any(
            v is not None for v in (self.max_bytes, self.max_trees, self.older_than, self.min_count)
        )


@dataclass
class PrunePlan:
    """What a prune would remove (per reason), and what would remain."""

    corrupt: list[str] = field(default_factory=list)
    old: list[str] = field(default_factory=list)
    trimmed_empty: list[str] = field(default_factory=list)
    lru: list[str] = field(default_factory=list)
    nodes_trimmed: int = 0
    trees_before: int = 0
    bytes_before: int = 0
    trees_after: int = 0
    bytes_after: int = 0

    def evicted(self) -> list[str]:
        return self.corrupt + self.old + self.trimmed_empty + self.lru

    def to_dict(self) -> dict:
        return {
            "corrupt_dropped": len(self.corrupt), "old_dropped": len(self.old),
            "trimmed_empty": len(self.trimmed_empty), "lru_evicted": len(self.lru),
            "trees_removed": len(self.evicted()), "nodes_trimmed": self.nodes_trimmed,
            "trees_before": self.trees_before, "trees_after": self.trees_after,
            "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
        }


def _trim(value: bytes, now: int, half_life: float, min_count: float) -> tuple[TokenTree, int]:
    """A record's tree decayed to `now` with nodes below `min_count` dropped; (tree, nodes dropped)."""
    stamp, table = decode_record(value)
    tree = TokenTree.from_bytes(table)
    before = tree.nodes
    tree.scale(decay_factor(now, stamp, half_life), floor=min_count)
    return tree, before - tree.nodes


def plan_prune(store: CacheStore, crit: PruneCriteria, wall_now: float | None = None) -> PrunePlan:
    """What `apply_prune` would do now; modifies nothing."""
    wall_now = time.time() if wall_now is None else wall_now
    info = store.info()
    now = int(info["tick"])
    plan = PrunePlan()
    live: list[tuple[float, str, int]] = []  # (last access, uid, bytes) of trees that stay
    for uid, head, meta in list(store.scan()):  # a snapshot; trimming reads records again
        size = (head.disk_bytes if isinstance(head, RecordHeader) else 0) + META_BYTES + 2 * len(uid)
        plan.trees_before += 1
        plan.bytes_before += size
        access = meta.access_wall if meta is not None else 0.0
        if not isinstance(head, RecordHeader):
            if crit.drop_corrupt:
                plan.corrupt.append(uid)
                continue
        elif crit.older_than is not None and access < wall_now - crit.older_than:
            plan.old.append(uid)
            continue
        elif crit.min_count is not None:
            size = _plan_trim(store, uid, now, info["half_life"], crit.min_count, plan)
            if size is None:
                continue
        live.append((access, uid, size))
    live.sort()
    _plan_lru(live, crit, plan)
    return plan


def _plan_trim(store: CacheStore, uid: str, now: int, half_life: float, min_count: float,
               plan: PrunePlan) -> int | None:
    """Trim one tree in memory; its size after trimming, or None if it would be emptied."""
    value = store.raw_record(uid)
    try:
        tree, dropped = _trim(value, now, half_life, min_count)
    except (CorruptRecord, ValueError):  # turned corrupt since the scan: leave it to --drop-corrupt
        return len(value) + META_BYTES + 2 * len(uid)
    plan.nodes_trimmed += dropped
    if tree.nodes == 0:
        plan.trimmed_empty.append(uid)
        return None
    return len(encode_record(tree.to_bytes(), now)) + META_BYTES + 2 * len(uid)


def _plan_lru(live: list[tuple[float, str, int]], crit: PruneCriteria, plan: PrunePlan) -> None:
    """Evict from the least recently used end of `live` (sorted oldest first) to the budgets."""
    total = sum(size for _, _, size in live)
    count = len(live)
    i = 0
    while i < len(live) and (
        (crit.max_trees is not None and count > crit.max_trees)
        or (crit.max_bytes is not None and total > crit.max_bytes)
    ):
        plan.lru.append(live[i][1])
        total -= live[i][2]
        count -= 1
        i += 1
    plan.trees_after, plan.bytes_after = count, total


def apply_prune(store: CacheStore, crit: PruneCriteria, plan: PrunePlan) -> None:
    """Delete the planned trees and trim the rest, in one write transaction."""
    h = store.handle()
    gone = set(plan.evicted())

    def fn(txn: lmdb.Transaction) -> None:
        info = envmod.get_info(txn, h)
        now = int(info["tick"])
        for uid in gone:
            txn.delete(uid.encode(), db=h.dbs["trees"])
            txn.delete(uid.encode(), db=h.dbs["meta"])
        if crit.min_count is None:
            return
        keys = [k for k, _ in txn.cursor(db=h.dbs["trees"])]
        for key in keys:
            _apply_trim(store, txn, key, now, info["half_life"], crit.min_count)

    envmod.write(h, fn)


def _apply_trim(store: CacheStore, txn: lmdb.Transaction, key: bytes, now: int,
                half_life: float, min_count: float) -> None:
    h = store.handle()
    try:
        tree, dropped = _trim(txn.get(key, db=h.dbs["trees"]), now, half_life, min_count)
    except (CorruptRecord, ValueError):
        return  # corrupt records are only removed when asked (--drop-corrupt)
    if tree.nodes == 0:
        txn.delete(key, db=h.dbs["trees"])
        txn.delete(key, db=h.dbs["meta"])
    elif dropped:
        raw = txn.get(key, db=h.dbs["meta"])
        try:
            meta = MetaRecord.unpack(raw) if raw is not None else None
        except CorruptRecord:
            meta = None
        wall = meta.access_wall if meta is not None else time.time()
        tick = meta.access_tick if meta is not None else now
        store.put_tree(txn, key, tree, now, wall, tick)
