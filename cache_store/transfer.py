"""Moving caches around: compaction, export, import.

- `compact(store)`: LMDB never shrinks its file, so a compact copy is written beside it
  and swapped in with an atomic rename. Only safe with no other user: it takes the cache's
  `srt.lock` exclusively (every open holds it shared) and refuses if anyone else has it.
  A crash leaves either the old or the new file whole, plus a stray `.compact-*` folder that
  the next compaction removes.
- `export(store, out)`: a compacted copy in a new directory; it is itself a cache (same
  format), portable to any host with the same byte order and word size.
- `import_cache(store, src)`: adds another cache's counts to this one in one write
  transaction: each source tree is decayed to the *source's* clock, then merged like a
  commit (the destination tree decayed to its own now, plus the source counts, stamped now).
  Importing the same export twice adds its counts twice.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lmdb

from cache_store import env as envmod
from cache_store.clock import decay_factor
from cache_store.codec import MetaRecord, decode_record
from cache_store.errors import CacheError, CorruptRecord
from cache_store.store import CacheStore
from cache_store.trie import TokenTree


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_compact(h: envmod.EnvHandle, out: Path) -> None:
    """A compact copy of the environment's data file into the empty directory `out`."""
    h.env.copy(str(out), compact=True)
    _fsync_path(out / "data.mdb")


def compact(store: CacheStore) -> tuple[int, int]:
    """Shrink the data file to its live pages; returns (bytes before, bytes after).

    Raises CacheBusyError if any other process (or another store in this one) has it open.
    """
    h = store.handle()
    envmod.exclusive(h)
    try:
        for stale in h.path.glob(".compact-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed compaction
        data = h.path / "data.mdb"
        before = data.stat().st_size
        tmp = Path(tempfile.mkdtemp(prefix=".compact-", dir=h.path))
        _copy_compact(h, tmp)
        map_size = h.env.info()["map_size"]
        h.env.close()
        os.replace(tmp / "data.mdb", data)  # atomic: readers see the old or the new file
        _fsync_path(h.path)
        shutil.rmtree(tmp, ignore_errors=True)
        h.env = envmod._lmdb_open(h.path, False, map_size)
        h.dbs = envmod._open_dbs(h.env, h.path)
        return before, data.stat().st_size
    finally:
        fcntl.flock(h.lock_fd, fcntl.LOCK_SH)


def check_compactable(store: CacheStore) -> None:
    """Raise CacheBusyError now if `compact` would be refused (so a prune can stop first)."""
    h = store.handle()
    envmod.exclusive(h)
    fcntl.flock(h.lock_fd, fcntl.LOCK_SH)


def export(store: CacheStore, out: str | Path) -> int:
    """Write a compacted, portable copy of the cache to the new directory `out`; its size.

    `out` must not exist, or be an empty directory. Safe while others use the cache (the
    copy is one consistent snapshot).
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CacheError(f"{out}: already exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    _copy_compact(store.handle(), out)
    return (out / "data.mdb").stat().st_size


@dataclass
class ImportReport:
    """What `import_cache` did."""

    trees: int = 0      # source trees merged
    new: int = 0        # of those, trees the destination did not have
    corrupt: int = 0    # source records skipped as corrupt
    incompatible: int = 0  # source trees skipped: a different max_depth than the stored tree
    tokens: float = 0.0  # count mass added (source mass decayed to the source's clock)


def import_cache(store: CacheStore, src_path: str | Path) -> ImportReport:
    """Merge every tree of the cache at `src_path` into `store` (one write transaction)."""
    src_path = Path(src_path)
    if os.path.realpath(src_path) == os.path.realpath(store.path):
        raise CacheError(f"{src_path}: cannot import a cache into itself")
    src = CacheStore.open(src_path, create=False, readonly=True)
    try:
        return _import(store, src)
    finally:
        src.close()


def _import(store: CacheStore, src: CacheStore) -> ImportReport:
    h, sh = store.handle(), src.handle()
    sinfo = src.info()

    def fn(txn: lmdb.Transaction) -> ImportReport:
        rep = ImportReport()
        info = envmod.get_info(txn, h)
        now = int(info["tick"])
        with sh.env.begin() as stxn:
            for key, value in stxn.cursor(db=sh.dbs["trees"]):
                tree = _source_tree(value, sinfo)
                if tree is None:
                    rep.corrupt += 1
                    continue
                wall = _access(stxn.get(key, db=sh.dbs["meta"]))
                old = txn.get(key, db=h.dbs["trees"])
                mine = None if old is None else store.decode_tree(key.decode(), old, info)
                if mine is None:
                    rep.new += old is None
                    mine = tree
                elif mine.max_depth != tree.max_depth:
                    rep.incompatible += 1
                    continue
                else:
                    mine.merge(tree)
                    wall = max(wall, _access(txn.get(key, db=h.dbs["meta"])))
                rep.trees += 1
                rep.tokens += tree.mass
                store.put_tree(txn, key, mine, now, wall, now)
        return rep

    return envmod.write(h, fn)


def _source_tree(value: bytes, sinfo: dict) -> TokenTree | None:
    try:
        stamp, table = decode_record(value)
        tree = TokenTree.from_bytes(table)
    except (CorruptRecord, ValueError):
        return None
    factor = decay_factor(int(sinfo["tick"]), stamp, sinfo["half_life"])
    if factor < 1.0:
        tree.scale(factor, floor=sinfo["floor"])
    return tree


def _access(raw: bytes | None) -> float:
    try:
        return MetaRecord.unpack(raw).access_wall if raw is not None else time.time()
    except CorruptRecord:
        return time.time()
