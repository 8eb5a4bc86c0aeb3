"""`cache_stats`: what a cache holds, read from meta records and checksums only.

Nothing is decompressed: sizes, node counts and count mass come from the meta records
(cache_store.codec), corruption from the tree records' CRCs. `tokens` is the count mass
decayed to the current tick (before the floor, which only decompression could apply).
"""

from __future__ import annotations

import heapq
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from cache_store.clock import decay_factor
from cache_store.codec import META_BYTES, MetaRecord
from cache_store.errors import CorruptRecord
from cache_store.store import CacheStore


@dataclass
class TreeSummary:
    """One tree, as `stats` lists the largest ones."""

    uid: str
    nodes: int
    tokens: float
    disk_bytes: int
    last_access: float


@dataclass
class CacheStats:
    """The numbers `srt cache stats` prints (and its --json object)."""

    path: str
    trees: int = 0
    nodes: int = 0
    tokens: float = 0.0
    disk_bytes: int = 0          # the data file on disk
    used_bytes: int = 0          # LMDB pages in use (the rest is free space until --compact)
    live_bytes: int = 0          # stored records: compressed trees + meta records
    raw_bytes: int = 0           # uncompressed node tables of the valid trees
    compression_ratio: float = 0.0
    corrupt: int | None = 0      # None: not checked (--no-verify)
    corrupt_uids: list[str] = field(default_factory=list)
    missing_meta: int = 0
    oldest_access: float | None = None
    newest_access: float | None = None
    tick: int = 0
    half_life: float = 0.0
    floor: float = 0.0
    largest: list[TreeSummary] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cache_stats(store: CacheStore, top: int = 5, verify: bool = True) -> CacheStats:
    """Scan the cache once and summarise it; nothing is decompressed.

    `verify` checks every record's checksum (reads all record bytes, from the memory map);
    without it only meta records are read and `corrupt` is None (not checked).
    """
    info = store.info()
    now, hl = int(info["tick"]), info["half_life"]
    st = CacheStats(path=str(store.path), tick=now, half_life=hl, floor=info["floor"])
    largest: list[tuple[int, str, TreeSummary]] = []
    disk = 0
    for uid, head, meta in store.scan(verify=verify):
        if isinstance(head, CorruptRecord):
            st.corrupt += 1
            if len(st.corrupt_uids) < 20:
                st.corrupt_uids.append(uid)
            continue
        st.trees += 1
        if meta is None:
            st.missing_meta += 1
            if head is not None:
                st.raw_bytes, disk = st.raw_bytes + head.raw_bytes, disk + head.disk_bytes
                st.live_bytes += head.disk_bytes + len(uid)
            continue
        size = meta.disk_bytes if head is None else head.disk_bytes
        st.raw_bytes += meta.raw_bytes if head is None else head.raw_bytes
        disk += size
        st.live_bytes += size + META_BYTES + 2 * len(uid)  # the record, the meta record, their keys
        _add_tree(st, largest, top, uid, meta, size, meta.mass * decay_factor(now, meta.stamp, hl))
    st.largest = [t for _, _, t in sorted(largest, reverse=True)]
    st.compression_ratio = st.raw_bytes / disk if disk else 0.0
    st.disk_bytes = os.path.getsize(store.path / "data.mdb")
    st.used_bytes = _used_bytes(store)
    if not verify:
        st.corrupt = None
    return st


def _add_tree(st: CacheStats, largest: list, top: int, uid: str, meta: MetaRecord, size: int,
              tokens: float) -> None:
    st.nodes += meta.nodes
    st.tokens += tokens
    st.oldest_access = meta.access_wall if st.oldest_access is None else min(st.oldest_access, meta.access_wall)
    st.newest_access = meta.access_wall if st.newest_access is None else max(st.newest_access, meta.access_wall)
    item = (size, uid, TreeSummary(uid, meta.nodes, tokens, size, meta.access_wall))
    if len(largest) < top:
        heapq.heappush(largest, item)
    elif top:
        heapq.heappushpop(largest, item)


def _used_bytes(store: CacheStore) -> int:
    """Bytes of LMDB pages in use across the main and named databases."""
    env = store.env
    total = 0
    with env.begin() as txn:
        stats = [env.stat()] + [txn.stat(db) for db in store.handle().dbs.values()]
    for s in stats:
        total += (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * s["psize"]
    return total
