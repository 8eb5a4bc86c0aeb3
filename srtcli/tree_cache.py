"""The tree cache: where it lives, and the one object a run holds it by.

The cache is `--cache DIR`, else `$SRT_CACHE`, else `~/.cache/srt`, for every command that
drafts from it or manages it; the store itself is `cache_store.seqstore.LmdbSequenceStore`
(each prompt's rollouts as append-only sequence records, docs/cache.md). Opening it turns every
cache failure (a foreign directory, a newer format, a cache of the earlier tree format, a busy
or corrupt LMDB) into one `SrtError` line naming the directory.

A rollout holds its cache as one `TreeCache`, whose lifecycle is:

    cache = TreeCache.open(path)      # the driver (or the vLLM proposer, in its worker)
    cache.stored(uid)                 # a drafter loading a prompt's tree
    cache.wait(uid, read)             # a drafter handing over sequences it finished
    cache.flush()                     # one append of everything waiting (batched by the drafter)
    cache.tick()                      # the driver, after each rollout batch: flush, then the clock
    cache.close()                     # flush, close the store

so what a batch wrote always reaches the store before its clock advances. A cache that does not
write (`writer=False`: a vLLM rank other than 0, so sequences are not stored once per rank)
loads like a writer and drops what waits.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from cache_store.seqstore import LOAD_NEWEST, LOAD_TOKENS
from srtcli.errors import SrtError

# what a waiting entry gives when it is appended: its sequences and their probabilities (None: none known)
Read = Callable[[], tuple[list, list | None]]


def default_cache_dir() -> Path:
    """`$SRT_CACHE`, else `~/.cache/srt`."""
    env = os.environ.get("SRT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "srt"


def cache_dir(opt: str | Path | None) -> Path:
    """--cache if given, else the default."""
    return Path(opt).expanduser() if opt else default_cache_dir()


def open_sequence_store(path: str | Path | None, create: bool = True, readonly: bool = False,
                        **settings: Any) -> Any:
    """The sequence store at `path` (default: `default_cache_dir`); the caller closes it."""
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
    """The sequence store for the length of a block (`srt cache`), whose cache errors also become
    one line."""
    import lmdb

    from cache_store.errors import CacheError

    store = open_sequence_store(path, create=create, readonly=readonly, **settings)
    try:
        yield store
    except CacheError as e:
        raise SrtError(str(e)) from None
    except lmdb.Error as e:
        raise SrtError(f"{store.path}: LMDB error: {e}") from None
    finally:
        store.close()


class TreeCache:
    """A sequence store as a run uses it: loads, the sequences waiting to be appended, the clock."""

    def __init__(self, store: Any, writer: bool = True):
        self.store, self.writer = store, writer
        self.pending: dict[str, list[Read]] = {}  # uid -> its waiting entries, in the order they came

    @classmethod
    def open(cls, path: str | Path | None, writer: bool = True) -> "TreeCache":
        """The cache at `path` (created if needed); a bad cache is one SrtError line."""
        return cls(open_sequence_store(path, create=True), writer)

    @property
    def path(self) -> Path:
        return self.store.path

    def stored(self, uid: str, tokens: int = LOAD_TOKENS, newest: int = LOAD_NEWEST) -> list[tuple]:
        """What a load builds the prompt's tree from: its newest stored sequences above the floor
        (at most `newest` of them and `tokens` tokens in all, the newest one whatever its
        length), oldest first, as (tokens, weight decayed to now, probs)."""
        return [(s.tokens, s.weight, s.probs) for s in self.store.read(uid, newest, tokens)]

    def wait(self, uid: str, read: Read) -> None:
        """Sequences of the prompt for the next append. `read` is called then, not now, so tokens
        streamed until the append are kept too."""
        self.pending.setdefault(uid, []).append(read)

    @property
    def waiting_prompts(self) -> int:
        return len(self.pending)

    @property
    def waiting(self) -> int:
        """Entries waiting (a drafter's unit: a group, or one sequence)."""
        return sum(map(len, self.pending.values()))

    def flush(self) -> bool:
        """Append everything waiting in one transaction (`append_many`); True if one ran. What
        waits is dropped either way (a cache that does not write, or an append that raised)."""
        pending, self.pending = self.pending, {}
        if not pending or not self.writer:
            return False
        seqs, probs = {}, {}
        for uid, reads in pending.items():
            seqs[uid], probs[uid] = [], []
            for read in reads:
                s, p = read()
                seqs[uid] += s
                probs[uid] += p if p is not None else [None] * len(s)
        known = any(p is not None for ps in probs.values() for p in ps)
        self.store.append_many(seqs, probs if known else None)
        return True

    def tick(self) -> None:
        """A rollout batch ended: what it wrote reaches the store, then the logical clock advances."""
        self.flush()
        self.store.tick()

    def close(self) -> None:
        """Append what waits, close the store."""
        try:
            self.flush()
        finally:
            self.store.close()
