"""`CacheStore`: per-prompt token trees persisted in LMDB, merged and decayed.

The rollout loop uses three calls:

    store = CacheStore.open(path)               # creates the cache if needed
    tree = store.load(uid)                      # decayed to now; None if absent or corrupt
    ... insert this batch's rollouts into a *delta* tree per prompt (counts added here) ...
    store.commit_many({uid: delta, ...})        # one write transaction for the batch
    store.tick()                                # once per rollout batch

Updates merge, never overwrite: `commit_many` adds each delta to the stored tree decayed
to the current tick and writes the result, checking inside the write transaction that it
merged against the tree as it is now, so processes committing to the same trees
concurrently lose no counts (LMDB serialises writers; docs/cache.md). Loads remember which trees were used; their access times are written with the
next commit, tick or close (LRU bookkeeping without a write per load).

Layout and record formats: cache_store.env and cache_store.codec.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import lmdb

from cache_store import env as envmod
from cache_store.clock import DEFAULT_FLOOR, DEFAULT_HALF_LIFE, check_settings, decay_factor
from cache_store.codec import MetaRecord, RecordHeader, check_record, decode_record, encode_record
from cache_store.errors import CacheError, CorruptRecord, CorruptTreeWarning
from cache_store.trie import TokenTree


@dataclass
class _Merged:
    """A merge computed against the stored record `old` at tick `now` (rec None: delete)."""

    old: bytes | None
    now: int
    rec: bytes | None
    meta: MetaRecord | None


def encode_tree(tree: TokenTree, stamp: int, access_wall: float, access_tick: int) -> tuple[bytes, MetaRecord]:
    """A tree's record (stamped `stamp`) and its meta record."""
    table = tree.to_bytes()
    rec = encode_record(table, stamp)
    meta = MetaRecord(access_wall=access_wall, access_tick=access_tick, stamp=stamp, disk_bytes=len(rec),
                      raw_bytes=len(table), nodes=tree.nodes, mass=float(tree.mass))
    return rec, meta


class CacheStore:
    """A cache directory opened by this process (see the module docstring)."""

    def __init__(self, handle: envmod.EnvHandle):
        self._h = handle
        self._touched: set[str] = set()
        self._warned: set[str] = set()
        self._closed = False

    @classmethod
    def open(
        cls, path: str | Path, create: bool = True, readonly: bool = False,
        half_life: float = DEFAULT_HALF_LIFE, floor: float = DEFAULT_FLOOR,
        map_size: int | None = None,
    ) -> "CacheStore":
        """Open the cache at `path` (created if missing and `create`).

        `half_life` (ticks) and `floor` are stored when the cache is created and ignored
        otherwise. Raises NotACacheError, FormatVersionError, ValueError (bad settings).
        """
        check_settings(half_life, floor)
        return cls(envmod.open_env(Path(path), create, readonly, map_size, half_life, floor))

    # -- settings and clock ------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._h.path

    @property
    def env(self) -> lmdb.Environment:
        return self._h.env

    def info(self) -> dict[str, float]:
        """`tick`, `half_life`, `floor`, `created` (unix seconds)."""
        return envmod.read(self._h, lambda txn: envmod.get_info(txn, self._h))

    def now(self) -> int:
        """The current logical tick."""
        return int(self.info()["tick"])

    def tick(self, n: int = 1) -> int:
        """Advance the logical clock by `n` (once per rollout batch); returns the new tick."""
        if n < 0:
            raise ValueError("the clock never goes back")

        def fn(txn: lmdb.Transaction) -> int:
            now = int(envmod.get_info(txn, self._h)["tick"]) + n
            envmod.set_tick(txn, self._h, now)
            self._flush_touched(txn, now)
            return now

        now = self._write(fn)
        self._touched.clear()
        return now

    # -- reading -----------------------------------------------------------------------

    def load(self, uid: str) -> TokenTree | None:
        """The tree of `uid` decayed to the current tick; None if absent or corrupt (warns)."""
        return self.load_many([uid])[uid]

    def load_many(self, uids: Iterable[str]) -> dict[str, TokenTree | None]:
        """`load` for many uids, reading them all in one transaction."""
        uids = list(uids)

        def fn(txn: lmdb.Transaction) -> tuple[dict, list]:
            info = envmod.get_info(txn, self._h)
            return info, [txn.get(u.encode(), db=self._h.dbs["trees"]) for u in uids]

        info, values = envmod.read(self._h, fn)
        out: dict[str, TokenTree | None] = {}
        for uid, value in zip(uids, values):
            tree = None if value is None else self.decode_tree(uid, value, info)
            if tree is not None:
                self._touched.add(uid)
            out[uid] = tree
        return out

    def decode_tree(self, uid: str, value: bytes, info: Mapping[str, float]) -> TokenTree | None:
        """Decode and decay a record; a corrupt one warns (once per uid) and gives None."""
        try:
            stamp, table = decode_record(value)
            tree = TokenTree.from_bytes(table)
        except (CorruptRecord, ValueError) as e:
            if uid not in self._warned:
                self._warned.add(uid)
                warnings.warn(
                    f"{self.path}: tree {uid} is corrupt ({e}); skipped "
                    "(`srt cache prune --drop-corrupt` removes it)", CorruptTreeWarning, stacklevel=3,
                )
            return None
        factor = decay_factor(int(info["tick"]), stamp, info["half_life"])
        if factor < 1.0:
            tree.scale(factor, floor=info["floor"])
        return tree

    # -- writing -----------------------------------------------------------------------

    def commit(self, uid: str, delta: TokenTree) -> None:
        """Merge the counts in `delta` into the stored tree of `uid` (see commit_many)."""
        self.commit_many({uid: delta})

    def commit_many(self, deltas: Mapping[str, TokenTree]) -> None:
        """Merge each delta (the counts added since load) into its stored tree, atomically.

        Per tree: read the stored tree, decay it to now, add the delta, write it stamped
        now. The merging is done first against a snapshot, outside the write lock; the
        write transaction then stores a result only if its tree and the clock are still
        exactly what the snapshot saw, and merges again inside the transaction otherwise.
        Either way every delta lands on the current tree, all of them in one transaction.
        A corrupt stored tree is replaced by the delta (with a warning): its counts were
        unreadable anyway. The deltas are not modified.
        """
        if self._h.readonly:
            raise CacheError(f"{self.path}: opened read-only")
        trees = self._h.dbs["trees"]
        info, olds = envmod.read(self._h, lambda txn: (
            envmod.get_info(txn, self._h), [txn.get(u.encode(), db=trees) for u in deltas]))
        ready = {u: self._prepare(u, d, old, info) for (u, d), old in zip(deltas.items(), olds)}

        def fn(txn: lmdb.Transaction) -> None:
            info = envmod.get_info(txn, self._h)
            now = int(info["tick"])
            for uid, delta in deltas.items():
                key = uid.encode()
                cur = txn.get(key, db=trees)
                p = ready[uid]
                if p.now != now or p.old != cur:  # changed since the snapshot: merge again
                    p = self._prepare(uid, delta, cur, info)
                if p.rec is None:
                    self._delete(txn, key)
                else:
                    p.meta.access_wall = time.time()
                    txn.put(key, p.rec, db=trees)
                    txn.put(key, p.meta.pack(), db=self._h.dbs["meta"])
            self._flush_touched(txn, now, skip=deltas.keys())

        self._write(fn)
        self._touched.clear()  # only once the transaction holding the access times committed

    def _prepare(self, uid: str, delta: TokenTree, old: bytes | None, info: Mapping[str, float]) -> _Merged:
        """The record that merging `delta` into the stored record `old` produces."""
        now = int(info["tick"])
        tree = None if old is None else self.decode_tree(uid, old, info)
        if tree is None:
            tree = delta
        else:
            tree.merge(delta)
        if tree.nodes == 0:
            return _Merged(old, now, None, None)
        rec, meta = encode_tree(tree, now, time.time(), now)
        return _Merged(old, now, rec, meta)

    def put_tree(self, txn: lmdb.Transaction, key: bytes, tree: TokenTree, stamp: int,
                 access_wall: float, access_tick: int | None = None) -> MetaRecord:
        """Write a tree record (stamped `stamp`) and its meta record inside `txn`."""
        rec, meta = encode_tree(tree, stamp, access_wall, stamp if access_tick is None else access_tick)
        txn.put(key, rec, db=self._h.dbs["trees"])
        txn.put(key, meta.pack(), db=self._h.dbs["meta"])
        return meta

    def delete_many(self, uids: Iterable[str]) -> int:
        """Remove trees (and their meta records) in one transaction; returns how many existed."""
        keys = [u.encode() for u in uids]
        return self._write(lambda txn: sum(self._delete(txn, k) for k in keys))

    def _delete(self, txn: lmdb.Transaction, key: bytes) -> bool:
        gone = txn.delete(key, db=self._h.dbs["trees"])
        return txn.delete(key, db=self._h.dbs["meta"]) or gone

    def _flush_touched(self, txn: lmdb.Transaction, now: int, skip: Iterable[str] = ()) -> None:
        """Write access times for trees loaded since the last flush (LRU bookkeeping)."""
        todo = self._touched.difference(skip)
        wall = time.time()
        for uid in todo:
            key = uid.encode()
            raw = txn.get(key, db=self._h.dbs["meta"])
            try:
                meta = MetaRecord.unpack(raw) if raw is not None else None
            except CorruptRecord:
                meta = None
            if meta is not None:
                meta.access_wall, meta.access_tick = wall, now
                txn.put(key, meta.pack(), db=self._h.dbs["meta"])

    def _write(self, fn):  # type: ignore[no-untyped-def]
        if self._closed:
            raise CacheError(f"{self.path}: the store is closed")
        return envmod.write(self._h, fn)

    # -- scanning (stats, prune, export) ---------------------------------------------

    def scan(self, verify: bool = True) -> Iterator[tuple[str, RecordHeader | CorruptRecord | None, MetaRecord | None]]:
        """Every stored tree: (uid, header or the CorruptRecord error, meta or None).

        Reads one snapshot and decompresses nothing. `verify` checks each record's CRC,
        straight from LMDB's memory map (no copy); without it the header is None and only
        the small meta records are read.
        """
        with self.env.begin(buffers=True) as txn:
            metas = txn.cursor(db=self._h.dbs["meta"])
            trees = txn.cursor(db=self._h.dbs["trees"])
            for key, value in (trees.iternext() if verify else ((k, None) for k in trees.iternext(values=False))):
                head: RecordHeader | CorruptRecord | None = None
                if verify:
                    try:
                        head = check_record(value)
                    except CorruptRecord as e:
                        head = e
                raw = metas.get(key)
                try:
                    meta = MetaRecord.unpack(raw) if raw is not None else None
                except CorruptRecord:
                    meta = None
                yield bytes(key).decode(errors="replace"), head, meta

    def raw_record(self, uid: str) -> bytes | None:
        """A tree's stored record bytes (for tools and tests)."""
        return envmod.read(self._h, lambda txn: txn.get(uid.encode(), db=self._h.dbs["trees"]))

    def handle(self) -> envmod.EnvHandle:
        """The process-wide LMDB handle (compaction and import work on it directly)."""
        return self._h

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Write pending access times and release this process's handle (idempotent)."""
        if self._closed:
            return
        try:
            if self._touched and not self._h.readonly:
                self._write(lambda txn: self._flush_touched(txn, int(envmod.get_info(txn, self._h)["tick"])))
                self._touched.clear()
        finally:
            self._closed = True
            envmod.release(self._h)

    def __enter__(self) -> "CacheStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
