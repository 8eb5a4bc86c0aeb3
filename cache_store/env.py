"""One LMDB environment per cache directory per process, and the cache's header (`info`).

A cache directory is one LMDB environment with three named sub-databases:

    info   format name, format version, logical clock, half-life, floor, creation time
    trees  uid -> tree record (cache_store.codec)
    meta   uid -> meta record (access time, sizes, mass; read by stats/prune)

LMDB rules this module enforces (see docs/cache.md):
- one `lmdb.Environment` per path per process: `open_env` keeps a registry keyed by the
  real path and the pid, so a forked child never reuses its parent's handle;
- the map is a 1 TiB sparse reservation; a write that still hits MapFullError doubles it
  and retries (`write`), and a map grown by another process is adopted (MapResizedError);
- `reader_check()` on open clears reader slots left by killed processes;
- every process holds a shared `flock` on `srt.lock`; compaction takes it exclusively, so
  the data file is never swapped under a live user;
- a directory that is not an srt cache is refused before `srt.lock` is created or LMDB's
  lock file touched: a refused directory is left byte for byte as it was.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import lmdb

from cache_store.errors import CacheBusyError, CacheError, FormatVersionError, NotACacheError

FORMAT_NAME = b"srt-cache"
FORMAT_VERSION = 1
DEFAULT_MAP_SIZE = 1 << 40  # a sparse reservation, not disk space
FALLBACK_MAP_SIZES = (1 << 36, 1 << 32, 1 << 30)  # for hosts that refuse a 1 TiB mapping
LOCK_NAME = "srt.lock"
DB_NAMES = (b"info", b"trees", b"meta")

T = TypeVar("T")


@dataclass
class EnvHandle:
    """The process-wide handle of one open cache directory (shared by every CacheStore on it)."""

    path: Path
    env: lmdb.Environment
    dbs: dict[str, Any]
    readonly: bool
    lock_fd: int | None
    pid: int = field(default_factory=os.getpid)
    users: int = 1


_registry: dict[str, EnvHandle] = {}


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _check_dir(path: Path, create: bool) -> bool:
    """Whether the directory must be initialised; raises NotACacheError for anything foreign."""
    if not path.exists():
        if not create:
            raise NotACacheError(f"{path}: no such cache directory")
        path.mkdir(parents=True)
        return True
    if not path.is_dir():
        raise NotACacheError(f"{path}: not a directory (a cache is a directory)")
    if (path / "data.mdb").exists():
        return False
    others = [p.name for p in path.iterdir() if p.name not in (LOCK_NAME, "lock.mdb")]
    if others or not create:
        raise NotACacheError(f"{path}: not an srt cache (no data.mdb)")
    return True


def _lmdb_open(path: Path, readonly: bool, map_size: int | None) -> lmdb.Environment:
    sizes = (map_size,) if map_size else (DEFAULT_MAP_SIZE, *FALLBACK_MAP_SIZES)
    last: Exception | None = None
    for size in sizes:
        try:
            return lmdb.open(
                str(path), map_size=size, max_dbs=len(DB_NAMES) + 2, readonly=readonly,
                create=False, subdir=True, lock=True, max_readers=512, meminit=False,
            )
        except lmdb.InvalidError as e:
            raise NotACacheError(f"{path}: not an srt cache (data.mdb is not an LMDB file)") from e
        except (lmdb.MemoryError, OSError, lmdb.Error) as e:  # mapping refused: try smaller
            last = e
    raise NotACacheError(f"{path}: cannot open the cache ({last})")


def _init_info(env: lmdb.Environment, half_life: float, floor: float) -> None:
    with env.begin(write=True) as txn:
        info = env.open_db(b"info", txn=txn)
        if txn.get(b"format", db=info) is not None:
            return  # another process initialised it first
        for name in DB_NAMES[1:]:
            env.open_db(name, txn=txn)
        txn.put(b"format", FORMAT_NAME, db=info)
        txn.put(b"version", str(FORMAT_VERSION).encode(), db=info)
        txn.put(b"tick", struct.pack("<Q", 0), db=info)
        txn.put(b"half_life", struct.pack("<d", half_life), db=info)
        txn.put(b"floor", struct.pack("<d", floor), db=info)
        txn.put(b"created", struct.pack("<d", time.time()), db=info)


def _open_dbs(env: lmdb.Environment, path: Path) -> dict[str, Any]:
    # Handles must be opened outside a caller's read transaction: LMDB discards a handle
    # opened in a read transaction that py-lmdb then ends.
    try:
        info = env.open_db(b"info", create=False)
        with env.begin() as txn:
            fmt = txn.get(b"format", db=info)
            ver = txn.get(b"version", db=info)
        if fmt != FORMAT_NAME or ver is None:
            raise NotACacheError(f"{path}: not an srt cache (foreign LMDB database)")
        if int(ver) > FORMAT_VERSION:
            raise FormatVersionError(
                f"{path}: cache format version {int(ver)} is newer than this srt reads "
                f"({FORMAT_VERSION}); upgrade srt"
            )
        dbs = {"info": info}
        for name in DB_NAMES[1:]:
            dbs[name.decode()] = env.open_db(name, create=False)
        return dbs
    except (lmdb.NotFoundError, lmdb.IncompatibleError, ValueError):
        raise NotACacheError(f"{path}: not an srt cache (foreign LMDB database)") from None


def _refuse_foreign(path: Path) -> None:
    """Refuse a foreign LMDB before anything is written to it: `srt.lock` and LMDB's own lock
    file (which every locking open rewrites) stay untouched. Only directories without
    `srt.lock` get this look (a foreign one, or an srt cache no srt process has opened for
    writing, e.g. a copied data.mdb): read-only and without LMDB's lock, which is safe because
    no srt process writes a cache without first creating `srt.lock`."""
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, create=False, subdir=True,
                        max_dbs=len(DB_NAMES) + 2)
    except lmdb.InvalidError as e:
        raise NotACacheError(f"{path}: not an srt cache (data.mdb is not an LMDB file)") from e
    except lmdb.Error:
        return  # e.g. a mapping refused: the real open reports it
    try:
        _open_dbs(env, path)
    finally:
        env.close()


def _shared_lock(path: Path, readonly: bool) -> int | None:
    lock = path / LOCK_NAME
    if readonly and not lock.exists():
        return None  # e.g. an exported copy: read it without adding files to it
    # a read-only descriptor is enough for flock, and works on read-only media
    fd = os.open(lock, os.O_RDONLY) if readonly else os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a compaction holds it exclusively
    return fd


def open_env(
    path: Path, create: bool = True, readonly: bool = False, map_size: int | None = None,
    half_life: float = 100.0, floor: float = 0.1,
) -> EnvHandle:
    """Open (or create) the cache at `path`, reusing this process's handle if it has one.

    `half_life`/`floor` apply only when the cache is created here. Raises NotACacheError,
    FormatVersionError.
    """
    path = Path(path)
    key = _real(path)
    h = _registry.get(key)
    if h is not None and h.pid == os.getpid():
        if h.readonly and not readonly:
            raise CacheBusyError(f"{path}: already open read-only in this process")
        h.users += 1
        return h
    if h is not None:  # inherited across fork: drop it (the parent's locks are not ours)
        _forget_inherited(_registry.pop(key))
    try:
        h = _open_new(path, create, readonly, map_size, half_life, floor)
    except OSError as e:  # permissions, a full disk, ...: still one line for the user
        raise CacheError(f"{path}: cannot open the cache: {e.strerror or e}") from None
    _registry[key] = h
    return h


def _open_new(path: Path, create: bool, readonly: bool, map_size: int | None, half_life: float,
              floor: float) -> EnvHandle:
    fresh = _check_dir(path, create and not readonly)
    if not fresh and not (path / LOCK_NAME).exists():
        _refuse_foreign(path)
    lock_fd = _shared_lock(path, readonly)
    env = None
    try:
        env = _lmdb_open(path, readonly and not fresh, map_size)
        if fresh:
            _init_info(env, half_life, floor)
        try:
            env.reader_check()  # slots of killed readers would pin old pages forever
        except lmdb.Error:
            if not readonly:
                raise
        dbs = _open_dbs(env, path)
    except BaseException:
        if env is not None:
            env.close()  # else py-lmdb believes the files stay open in this process
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    return EnvHandle(path=path, env=env, dbs=dbs, readonly=readonly, lock_fd=lock_fd)


def _forget_inherited(h: EnvHandle) -> None:
    """Close a forked child's copy of its parent's handle without using the environment.

    py-lmdb refuses a second open of files it believes open, and a child's copy counts.
    Closing it in the child releases only the child's mapping and descriptors: the
    parent's fcntl locks and reader slots belong to the parent's pid, and the `srt.lock`
    flock stays held through the parent's descriptor.
    """
    try:
        h.env.close()
    finally:
        if h.lock_fd is not None:
            os.close(h.lock_fd)


def release(h: EnvHandle) -> None:
    """Drop one user of a handle; the last one closes the environment and its lock."""
    h.users -= 1
    if h.users > 0:
        return
    if h.pid == os.getpid():
        h.env.close()
        if h.lock_fd is not None:
            os.close(h.lock_fd)
    key = _real(h.path)
    if _registry.get(key) is h:
        del _registry[key]


def write(h: EnvHandle, fn: Callable[[lmdb.Transaction], T]) -> T:
    """Run `fn` in one write transaction; grow the map and retry when it is full.

    `fn` must read everything it needs inside the transaction (it may run twice).
    """
    while True:
        try:
            with h.env.begin(write=True) as txn:
                return fn(txn)
        except lmdb.MapFullError:
            h.env.set_mapsize(h.env.info()["map_size"] * 2)
        except lmdb.MapResizedError:  # another process grew it: adopt its size
            h.env.set_mapsize(0)


def read(h: EnvHandle, fn: Callable[[lmdb.Transaction], T]) -> T:
    """Run `fn` in one read transaction (adopting a map another process grew)."""
    while True:
        try:
            with h.env.begin() as txn:
                return fn(txn)
        except lmdb.MapResizedError:
            h.env.set_mapsize(0)


def get_info(txn: lmdb.Transaction, h: EnvHandle) -> dict[str, float]:
    """The clock and decay settings, read inside a transaction."""
    db = h.dbs["info"]
    return {
        "tick": struct.unpack("<Q", txn.get(b"tick", db=db))[0],
        "half_life": struct.unpack("<d", txn.get(b"half_life", db=db))[0],
        "floor": struct.unpack("<d", txn.get(b"floor", db=db))[0],
        "created": struct.unpack("<d", txn.get(b"created", db=db))[0],
    }


def set_tick(txn: lmdb.Transaction, h: EnvHandle, tick: int) -> None:
    txn.put(b"tick", struct.pack("<Q", tick), db=h.dbs["info"])


def exclusive(h: EnvHandle) -> None:
    """Take the cache for this process alone (compaction); raises CacheBusyError."""
    if h.users != 1 or h.lock_fd is None:
        raise CacheBusyError(f"{h.path}: the cache is in use elsewhere in this process")
    try:
        fcntl.flock(h.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fcntl.flock(h.lock_fd, fcntl.LOCK_SH)  # Linux drops the old lock on a failed upgrade
        raise CacheBusyError(f"{h.path}: the cache is in use by another process; retry when it is idle") from None
