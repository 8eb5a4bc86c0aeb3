"""Where a sequence store lives, and moving records between any two stores.

A location is a directory (an LMDB store, cache_store.seqstore: one machine, the default) or a
cache server's URL, `redis://[user:password@]host:port/db` or `rediss://` for TLS
(cache_store.redis_store: one cache every machine shares). This module is the one place that
tells the two apart (`store.is_server_url`) and opens either:

    store = open_store("runs/cache")            # or "redis://host:6379/0?prefix=srt"
    export_store(store, "backup")               # into a new directory or an empty server
    import_store(store, "other-cache")          # append another store's sequences

Copies and merges use only the store interface (cache_store.seqtransfer), so any backend goes
into any other and LMDB -> server -> LMDB gives back the same records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cache_store.errors import CacheError
from cache_store.redis_store import RedisSequenceStore
from cache_store.seqstore import LmdbSequenceStore
from cache_store.seqtransfer import ImportReport, copy_store, merge_store
from cache_store.store import SequenceStore, is_server_url

Location = str | Path


def open_store(location: Location, create: bool = True, readonly: bool = False, **settings: Any) -> SequenceStore:
    """The store at `location` (created when missing and `create`; `settings`, half_life and
    floor, apply only then). Errors as the backend's `open` raises them: CacheError (and its
    kinds) for a store that cannot be used, ValueError for a bad URL or setting."""
    if is_server_url(location):
        return RedisSequenceStore.open(str(location), create=create, readonly=readonly, **settings)
    return LmdbSequenceStore.open(location, create=create, readonly=readonly, **settings)


def export_store(store: SequenceStore, dst: Location | SequenceStore) -> int:
    """Copy `store` into `dst`, which must be empty. An open store or a server's URL gets every
    record as it is, with the clock and settings (seqtransfer.copy_store): the record bytes
    copied. A directory (new, or empty) becomes an LMDB store: from LMDB a compacted copy of the
    environment, from a server the records copied in; its data file's size."""
    if isinstance(dst, SequenceStore):
        return copy_store(store, dst).bytes
    if is_server_url(dst):
        with open_store(dst) as out:
            return copy_store(store, out).bytes
    if isinstance(store, LmdbSequenceStore):
        return store.export_compacted(dst)
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CacheError(f"{dst}: already exists and is not an empty directory")
    with LmdbSequenceStore.open(dst) as out:
        copy_store(store, out)
    return (dst / "data.mdb").stat().st_size


def import_store(store: SequenceStore, src: Location | SequenceStore) -> ImportReport:
    """Append every sequence of `src` (an open store, a server's URL or a directory) to `store`,
    each keeping its age and weight (seqtransfer.merge_store). CacheError for a read-only
    `store` or a store imported into itself, OldFormatError for srt's earlier tree-format cache."""
    if store.readonly:
        raise CacheError(f"{store.path}: opened read-only")
    if isinstance(src, SequenceStore):
        return merge_store(src, store)
    if not is_server_url(src) and not is_server_url(store.path) and \
            os.path.realpath(src) == os.path.realpath(store.path):
        raise CacheError(f"{src}: cannot import a cache into itself")
    with open_store(src, create=False, readonly=True) as source:
        return merge_store(source, store)
