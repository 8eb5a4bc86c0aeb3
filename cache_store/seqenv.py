"""The LMDB environment of a sequence store: opening, the header (`info`), transactions.

A sequence store is a directory holding one LMDB environment with three named sub-databases:

    info   format b"srt-seqcache", version, logical clock, half-life, floor, creation time
    seqs   record key (cache_store.record_keys: uid + record number) -> sequence record (cache_store.seqrecord)
    meta   uid -> next record number, sequences, tokens, last write time, record bytes (`META`)

LMDB rules (docs/cache.md): one environment per path per process (a registry keyed by real
path and pid), a sparse 1 TiB map that a full write doubles, adoption of a map another process
grew, `reader_check()` on open. Every open holds a shared `flock` on `srt.lock`; compaction
takes it exclusively (`exclusive`), so the data file is never swapped under a live user.

An existing directory's header is read first without LMDB's locking and before `srt.lock` is
created, so a refused directory (a foreign LMDB: NotACacheError; srt's earlier tree format,
`srt-cache`: OldFormatError) is left byte for byte as it was.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import lmdb

from cache_store.errors import CacheBusyError, CacheError, FormatVersionError, NotACacheError, OldFormatError
from cache_store.fs_check import check_local
from cache_store.record_keys import LAST_NUMBER, key_number, record_key

FORMAT_NAME = b"srt-seqcache"
OLD_FORMAT_NAME = b"srt-cache"  # the tree cache of earlier srt versions
LOCK_NAME = "srt.lock"
FORMAT_VERSION = 1
MAP_SIZES = (1 << 40, 1 << 36, 1 << 32, 1 << 30)
DB_NAMES = (b"info", b"seqs", b"meta")
META = struct.Struct("<IQQdQ")  # next record number, sequences, tokens, last write time, record bytes

T = TypeVar("T")


@dataclass
class SeqEnv:
    """This process's handle on one sequence-store directory (shared by its stores)."""

    path: Path
    env: lmdb.Environment
    dbs: dict[str, Any]
    readonly: bool
    lock_fd: int | None = None
    pid: int = field(default_factory=os.getpid)
    users: int = 1

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run `fn` in one write transaction (it may run twice: read everything inside it)."""
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)

    def read(self, fn: Callable[[lmdb.Transaction], T], buffers: bool = False) -> T:
        while True:
            try:
                with self.env.begin(buffers=buffers) as txn:
                    return fn(txn)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)

    def get_info(self, txn: lmdb.Transaction) -> dict[str, float]:
        db = self.dbs["info"]
        get = lambda k, f: struct.unpack(f, bytes(txn.get(k, db=db)))[0]  # noqa: E731
        return {"tick": get(b"tick", "<Q"), "half_life": get(b"half_life", "<d"),
                "floor": get(b"floor", "<d"), "created": get(b"created", "<d")}

    def set_tick(self, txn: lmdb.Transaction, tick: int) -> None:
        txn.put(b"tick", struct.pack("<Q", tick), db=self.dbs["info"])

    def get_meta(self, txn: lmdb.Transaction, uid: bytes) -> tuple[int, int, int, float, int]:
        """A prompt's meta record (`META`'s fields); a missing or unreadable one reads as
        nothing stored yet, numbered on after the last record actually there."""
        raw = txn.get(uid, db=self.dbs["meta"])
        if raw is not None and len(raw) == META.size:
            return META.unpack(raw)
        return self.next_record(txn, uid), 0, 0, 0.0, 0

    def put_meta(self, txn: lmdb.Transaction, uid: bytes, meta: tuple[int, int, int, float, int]) -> None:
        txn.put(uid, META.pack(*meta), db=self.dbs["meta"])

    def next_record(self, txn: lmdb.Transaction, uid: bytes) -> int:
        """One past the highest record number stored under `uid` (0 if none)."""
        for key, _ in self.records(txn, uid, newest_first=True):
            return key_number(key) + 1
        return 0

    def records(self, txn: lmdb.Transaction, uid: bytes, newest_first: bool = False) -> Iterator[tuple[bytes, Any]]:
        """(key, value) of each of the prompt's records, in append order or newest first;
        each value is valid until the walk moves on."""
        cur = txn.cursor(db=self.dbs["seqs"])
        if newest_first:  # onto the newest record: the last key up to the highest record number
            last = record_key(uid, LAST_NUMBER)
            if cur.set_range(last):
                if bytes(cur.key()) != last and not cur.prev():
                    return
            elif not cur.last():
                return
        elif not cur.set_range(record_key(uid, 0)):
            return
        while bytes(cur.key()).startswith(uid):
            yield bytes(cur.key()), cur.value()
            if not (cur.prev() if newest_first else cur.next()):
                return

    def release(self) -> None:
        """Drop one user; the last one closes the environment (idempotent per user)."""
        self.users -= 1
        if self.users > 0:
            return
        if self.pid == os.getpid():
            self.env.close()
            _close_lock(self.lock_fd)
        if _registry.get(os.path.realpath(self.path)) is self:
            del _registry[os.path.realpath(self.path)]


_registry: dict[str, SeqEnv] = {}


def _lmdb_open(path: Path, readonly: bool) -> lmdb.Environment:
    last: Exception | None = None
    for size in MAP_SIZES:
        try:
            return lmdb.open(str(path), map_size=size, max_dbs=len(DB_NAMES) + 1, readonly=readonly,
                             create=False, subdir=True, max_readers=512, meminit=False)
        except lmdb.InvalidError as e:
            raise NotACacheError(f"{path}: not an srt cache (data.mdb is not an LMDB file)") from e
        except (lmdb.MemoryError, OSError, lmdb.Error) as e:
            last = e
    raise CacheError(f"{path}: cannot open the cache ({last})")


def _init(env: lmdb.Environment, half_life: float, floor: float) -> None:
    with env.begin(write=True) as txn:
        info = env.open_db(b"info", txn=txn)
        if txn.get(b"format", db=info) is not None:
            return
        for name in DB_NAMES[1:]:
            env.open_db(name, txn=txn)
        for k, v in ((b"format", FORMAT_NAME), (b"version", str(FORMAT_VERSION).encode()),
                     (b"tick", struct.pack("<Q", 0)), (b"half_life", struct.pack("<d", half_life)),
                     (b"floor", struct.pack("<d", floor)), (b"created", struct.pack("<d", time.time()))):
            txn.put(k, v, db=info)


def _open_dbs(env: lmdb.Environment, path: Path) -> dict[str, Any]:
    try:
        info = env.open_db(b"info", create=False)
        with env.begin() as txn:
            fmt, ver = txn.get(b"format", db=info), txn.get(b"version", db=info)
        if fmt == OLD_FORMAT_NAME:
            raise OldFormatError(old_format_message(path))
        if fmt != FORMAT_NAME or ver is None:
            raise NotACacheError(f"{path}: not an srt cache (format {fmt!r})")
        if int(ver) > FORMAT_VERSION:
            raise FormatVersionError(f"{path}: sequence store version {int(ver)} is newer than this srt "
                                     f"reads ({FORMAT_VERSION}); upgrade srt")
        return {"info": info, **{n.decode(): env.open_db(n, create=False) for n in DB_NAMES[1:]}}
    except (lmdb.NotFoundError, lmdb.IncompatibleError, ValueError):
        raise NotACacheError(f"{path}: not an srt cache (foreign LMDB database)") from None


def old_format_message(path: Path) -> str:
    """Why srt's earlier tree cache is refused, and the way on (one line)."""
    return (f"{path}: a cache of srt's earlier tree format (one trie per prompt), which cannot be "
            "converted exactly into the sequence store; move it aside and rebuild it from your steps "
            f"pools with `srt cache add POOL --cache {path}`")


def _probe(path: Path) -> None:
    """Refuse a foreign directory before anything is written to it: read its header without
    LMDB's locking (which would write `lock.mdb`) and without creating files."""
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, create=False, subdir=True,
                        max_dbs=len(DB_NAMES) + 1, map_size=MAP_SIZES[-1])
    except lmdb.InvalidError as e:
        raise NotACacheError(f"{path}: not an srt cache (data.mdb is not an LMDB file)") from e
    except lmdb.Error:
        return  # e.g. a map the host refuses: the locked open below reports it
    try:
        _open_dbs(env, path)
    finally:
        env.close()


def open_seq_env(path: Path, create: bool, readonly: bool, half_life: float, floor: float) -> SeqEnv:
    """This process's handle on the store at `path`, created if missing and `create`."""
    key = os.path.realpath(path)
    h = _registry.get(key)
    if h is not None and h.pid == os.getpid():
        h.users += 1
        return h
    if h is not None:  # inherited across fork: the child opens its own (the flock stays the parent's)
        _registry.pop(key)
        h.env.close()
        _close_lock(h.lock_fd)
    check_local(path)  # no LMDB on a network filesystem: refused before anything is created
    fresh = _check_target(path, create, readonly)
    env, lock_fd = _open_locked(path, readonly, fresh)
    try:
        if fresh:
            _init(env, half_life, floor)
        if not readonly:
            env.reader_check()  # slots of killed readers would pin old pages forever
        dbs = _open_dbs(env, path)
    except BaseException:
        env.close()
        _close_lock(lock_fd)
        raise
    h = _registry[key] = SeqEnv(path=path, env=env, dbs=dbs, readonly=readonly, lock_fd=lock_fd)
    return h


def _check_target(path: Path, create: bool, readonly: bool) -> bool:
    """Refuse what is not a store (before anything is created or locked); True if a new
    store is to be made at `path`."""
    if path.exists() and not path.is_dir():
        raise NotACacheError(f"{path}: not a directory (a cache is a directory)")
    fresh = not (path / "data.mdb").exists()
    if fresh and (readonly or not create):
        raise NotACacheError(f"{path}: no srt cache here")
    if fresh and path.exists() and any(p.name not in (LOCK_NAME, "lock.mdb") for p in path.iterdir()):
        raise NotACacheError(f"{path}: not an srt cache (no data.mdb)")
    if not fresh:
        _probe(path)
    return fresh


def _open_locked(path: Path, readonly: bool, fresh: bool) -> tuple[lmdb.Environment, int | None]:
    """The LMDB environment under this process's shared lock on `srt.lock`."""
    lock_fd = None
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock_fd = _shared_lock(path, readonly)
        return _lmdb_open(path, readonly and not fresh), lock_fd
    except OSError as e:
        _close_lock(lock_fd)
        raise CacheError(f"{path}: cannot open the cache: {e.strerror or e}") from None
    except BaseException:
        _close_lock(lock_fd)
        raise


def _shared_lock(path: Path, readonly: bool) -> int | None:
    """A shared flock on `srt.lock` (waits while a compaction holds it exclusively). A
    read-only open of a directory without one (an export) adds no file to it."""
    lock = path / LOCK_NAME
    if readonly and not lock.exists():
        return None
    fd = os.open(lock, os.O_RDONLY) if readonly else os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _close_lock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def exclusive(h: SeqEnv) -> None:
    """Hold `srt.lock` alone (for compaction) until `share` is called; CacheBusyError if any
    other store in this process or any other process has the directory open."""
    if h.users != 1 or h.lock_fd is None or h.readonly:
        raise CacheBusyError(f"{h.path}: the cache is in use elsewhere in this process")
    try:
        fcntl.flock(h.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        share(h)  # Linux drops the shared lock on a failed upgrade: take it back
        raise CacheBusyError(f"{h.path}: the cache is in use by another process; retry when it is idle") from None


def share(h: SeqEnv) -> None:
    """Back to the shared lock every open holds."""
    fcntl.flock(h.lock_fd, fcntl.LOCK_SH)


def reopen(h: SeqEnv, map_size: int) -> None:
    """Open the environment again in place (after compaction swapped its data file)."""
    h.env = _lmdb_open(h.path, h.readonly)
    h.env.set_mapsize(max(map_size, h.env.info()["map_size"]))
    h.dbs = _open_dbs(h.env, h.path)
