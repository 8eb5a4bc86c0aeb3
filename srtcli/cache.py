"""Where the tree cache lives and how a command opens it.

The cache is `--cache DIR`, else `$SRT_CACHE`, else `~/.cache/srt`, for every command that
drafts from it or manages it. Opening it turns every cache failure (a foreign directory, a newer
format, a cache of the earlier tree format, a busy or corrupt LMDB) into one `SrtError` line
naming the directory; the store itself is `cache_store.seqstore.LmdbSequenceStore` (each
prompt's rollouts as append-only sequence records, docs/cache.md).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from srtcli.errors import SrtError


def default_cache_dir() -> Path:
    """`$SRT_CACHE`, else `~/.cache/srt`."""
    env = os.environ.get("SRT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "srt"


def cache_dir(opt: str | Path | None) -> Path:
    """--cache if given, else the default."""
    return Path(opt).expanduser() if opt else default_cache_dir()


def open_cache(path: str | Path | None, create: bool = True, readonly: bool = False, **settings: Any) -> Any:
    """The cache at `path` (default: `default_cache_dir`); the caller closes it."""
    import lmdb

    from cache_store.errors import CacheError
    from cache_store.seqstore import LmdbSequenceStore

    path = cache_dir(path)
    try:
        return LmdbSequenceStore.open(path, create=create, readonly=readonly, **settings)
    except (CacheError, ValueError) as e:
        raise SrtError(str(e)) from None
    except lmdb.Error as e:
        raise SrtError(f"{path}: cannot open the cache: {e}") from None


@contextmanager
def open_store(path: str | Path | None, create: bool = False, readonly: bool = False,
               **settings: Any) -> Iterator[Any]:
    """`open_cache` for the length of a block, whose cache errors also become one line."""
    import lmdb

    from cache_store.errors import CacheError

    store = open_cache(path, create=create, readonly=readonly, **settings)
    try:
        yield store
    except CacheError as e:
        raise SrtError(str(e)) from None
    except lmdb.Error as e:
        raise SrtError(f"{store.path}: LMDB error: {e}") from None
    finally:
        store.close()
