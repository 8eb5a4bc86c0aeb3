"""The tree cache: where it lives, and the one object a run holds it by.

The cache is `--cache LOCATION`, else `$SRT_CACHE`, else `~/.cache/srt`, for every command that
drafts from it or manages it. A location is a directory (an LMDB store, the
embedded default: one machine) or a server URL, `redis://[user:password@]host:port/db` or
`rediss://` for TLS, with `?prefix=NAME` to keep several caches in one database (a Redis
store: one cache every machine of a run shares); cache_store.locations tells them apart. Both
hold each prompt's rollouts as append-only sequence records (docs/cache.md). Opening either
turns every cache failure (a foreign directory, a newer format, a cache of the earlier tree
format, a busy or corrupt LMDB, LMDB on a network filesystem, a server that cannot be reached
or refuses the password) into one `SrtError` line naming the location, its password masked.

A run reaches its cache through one `StoreLink` (owned by the run's tree session,
`srtcli.rollout.tree_session.TreeSession`, which decides when to append and tick):

    link = StoreLink.open(location)   # the driver (or the vLLM proposer, in its worker)
    link.stored(uid)                  # a prompt's stored sequences, for its tree
    link.queue(uid, seqs, probs)      # sequences that ended, for the next append
    link.append()                     # one append of everything queued
    link.tick()                       # a rollout batch ended: append, then the clock
    link.close()                      # append, close the store

so what a batch wrote always reaches the store before its clock advances. A link that does not
write (`writer=False`: a vLLM rank other than 0, so sequences are not stored once per rank)
loads like a writer and drops what is queued.

A cache server lost during a run never stops it and never loses a rollout: loads give empty
trees (drafting goes on from the trees in memory, and outputs stay exact: drafts only steer
what is verified), appends and ticks are retried with backoff, and what is still unsent when the
cache closes is written to a local LMDB store beside the run's output, named in one warning
line, which `srt cache import` adds to the cache once the server is back.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import lmdb

from cache_store.errors import CacheError, CacheUnavailable
from cache_store.locations import open_store as open_location
from cache_store.redis_store import mask_url
from cache_store.seqstore import LmdbSequenceStore
from cache_store.store import LOAD_NEWEST, LOAD_TOKENS, SequenceStore, is_server_url
from srtcli.errors import SrtError

RETRY_FIRST, RETRY_MAX = 0.5, 30.0  # seconds before the first retry of a lost server, and the longest wait
CLOSE_RETRIES = (0.5, 1.0, 2.0)  # the waits of the last tries before what is unsent goes to a local store

log = logging.getLogger("srt")


def cache_location(opt: str | Path | None) -> str | Path:
    """--cache if given, else `$SRT_CACHE`, else `~/.cache/srt`: a URL as it is (a Path would
    fold its `//`), a directory as a Path."""
    opt = opt or os.environ.get("SRT_CACHE") or Path.home() / ".cache" / "srt"
    return opt if is_server_url(opt) else Path(opt).expanduser()


def shown(location: str | Path | None) -> str:
    """A cache location as srt prints it anywhere: a URL with its password masked."""
    loc = cache_location(location)
    return mask_url(loc) if is_server_url(loc) else str(loc)


def open_sequence_store(location: str | Path | None, create: bool = True, readonly: bool = False,
                        **settings: Any) -> SequenceStore:
    """The sequence store at `location` (default: `cache_location(None)`); the caller closes it."""
    loc = cache_location(location)
    try:
        return open_location(loc, create=create, readonly=readonly, **settings)
    except (CacheError, ValueError) as e:
        raise SrtError(str(e)) from None
    except lmdb.Error as e:
        raise SrtError(f"{loc}: cannot open the cache: {e}") from None


@contextmanager
def open_store(path: str | Path | None, create: bool = False, readonly: bool = False,
               **settings: Any) -> Iterator[SequenceStore]:
    """The sequence store for the length of a block (`srt cache`), whose cache errors also become
    one line."""
    store = open_sequence_store(path, create=create, readonly=readonly, **settings)
    try:
        yield store
    except CacheError as e:
        raise SrtError(str(e)) from None
    except lmdb.Error as e:
        raise SrtError(f"{store.path}: LMDB error: {e}") from None
    finally:
        store.close()


@dataclass
class Batch:
    """Sequences for one append, by prompt, with their probabilities (None where unknown), and
    the id that append carries every time it is sent."""

    seqs: dict[str, list] = field(default_factory=dict)
    probs: dict[str, list] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def add(self, uid: str, seqs: list, probs: list | None) -> None:
        self.seqs.setdefault(uid, []).extend(seqs)
        self.probs.setdefault(uid, []).extend(probs if probs is not None else [None] * len(seqs))

    @property
    def sequences(self) -> int:
        return sum(map(len, self.seqs.values()))

    def known_probs(self) -> dict[str, list] | None:
        """`probs`, or None when no sequence has any (what `append_many` takes)."""
        return self.probs if any(p is not None for ps in self.probs.values() for p in ps) else None


class StoreLink:
    """A sequence store as a run uses it: bounded loads, the sequences queued for the next append,
    the clock.
    What a lost server could not take waits in `unsent` (and ticks in `missed_ticks`) until it
    is back, each batch with its own append id, so a batch whose first try landed unseen is
    not stored twice; `spill_dir` is where `close` leaves what it never took."""

    def __init__(self, store: SequenceStore, writer: bool = True, spill_dir: str | Path | None = None,
                 location: str | Path | None = None):
        self.store, self.writer = store, writer
        self.location = location if location is not None else store.path  # unmasked: for another process
        self.spill_dir = Path(spill_dir) if spill_dir is not None else Path.cwd()
        self.queued = Batch()  # what the next append takes
        self.unsent: list[Batch] = []  # batches taken, not yet appended, oldest first
        self.missed_ticks = 0
        self.lost, self.retry_at, self.backoff = False, 0.0, RETRY_FIRST

    @classmethod
    def open(cls, location: str | Path | None, writer: bool = True,
             spill_dir: str | Path | None = None) -> "StoreLink":
        """The cache at `location` (created if needed); a bad cache is one SrtError line."""
        return cls(open_sequence_store(location, create=True), writer, spill_dir, cache_location(location))

    @property
    def path(self) -> str:
        """Where the cache is, as srt prints it (a URL's password masked)."""
        return str(self.store.path)

    def stored(self, uid: str, tokens: int = LOAD_TOKENS, newest: int = LOAD_NEWEST) -> list[tuple]:
        """What a load builds the prompt's tree from: its newest stored sequences above the floor
        (at most `newest` of them and `tokens` tokens in all, the newest one whatever its
        length), oldest first, as (tokens, weight decayed to now, probs)."""
        if not self._reachable():
            return []
        try:
            return [(s.tokens, s.weight, s.probs) for s in self.store.read(uid, newest, tokens)]
        except CacheUnavailable as e:
            self._lose(e)
            return []

    def queue(self, uid: str, seqs: list, probs: list | None = None) -> None:
        """Sequences of the prompt (tokens, anchor first) and their probabilities (None: none
        known), for the next append."""
        self.queued.add(uid, seqs, probs)

    @property
    def waiting(self) -> int:
        """Sequences queued."""
        return self.queued.sequences

    def append(self) -> bool:
        """Append everything queued, and what a lost server has not taken yet, in one
        transaction (`append_many`); True if one ran. A link that does not write drops what is
        queued; a server that cannot be reached keeps it for the next try (`unsent`)."""
        batch, self.queued = self.queued, Batch()
        if not self.writer:
            return False
        if batch.seqs:
            self.unsent.append(batch)
        if not self.unsent or not self._reachable():
            return False
        try:
            while self.unsent:
                batch = self.unsent[0]
                self.store.append_many(batch.seqs, batch.known_probs(), append_id=batch.id)
                self.unsent.pop(0)
        except CacheUnavailable as e:
            self._lose(e)
            return False
        self._found()
        return True

    def tick(self) -> None:
        """A rollout batch ended: what it wrote reaches the store, then the logical clock advances
        (by the ticks a lost server missed too). A link that does not write ticks nothing."""
        self.append()
        if not self.writer:
            return
        self.missed_ticks += 1
        if not self._reachable():
            return
        try:
            self.store.tick(self.missed_ticks)
        except CacheUnavailable as e:
            self._lose(e)
            return
        self.missed_ticks = 0
        self._found()

    def close(self) -> None:
        """Append what is queued (a lost server gets a few last tries; what it still cannot take
        goes to a local store, `_spill`), close the store."""
        try:
            self.append()
            for wait in CLOSE_RETRIES if self.unsent else ():
                time.sleep(wait)
                self.retry_at = 0.0
                if self.append():
                    break
            if self.unsent:
                self._spill()
        finally:
            try:
                self.store.close()
            except CacheUnavailable:
                pass  # a lost server: nothing of ours is left on it to close

    def _reachable(self) -> bool:
        """Not known to be lost, or due for another try."""
        return not self.lost or time.monotonic() >= self.retry_at

    def _lose(self, e: Exception) -> None:
        """The server did not answer: say so once, try again after a backoff."""
        if not self.lost:
            log.warning("srt: %s; drafting goes on from the trees in memory, appends are retried", e)
        self.lost, self.retry_at = True, time.monotonic() + self.backoff
        self.backoff = min(2 * self.backoff, RETRY_MAX)

    def _found(self) -> None:
        if self.lost:
            log.warning("srt: the cache server %s answers again", self.path)
        self.lost, self.backoff = False, RETRY_FIRST

    def _spill(self) -> None:
        """What the server never took, as a local sequence store that `srt cache import` takes."""
        out = self.spill_dir / f"srt-unsent-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        with LmdbSequenceStore.open(out, create=True) as spill:
            for batch in self.unsent:
                spill.append_many(batch.seqs, batch.known_probs())
        n = sum(len(s) for b in self.unsent for s in b.seqs.values())
        prompts = len({uid for b in self.unsent for uid in b.seqs})
        log.warning("srt: the cache server %s did not come back: %d sequences of %d prompts are in %s; "
                    "add them with `srt cache import %s --cache %s` once it answers",
                    self.path, n, prompts, out, out, self.path)
        self.unsent = []
