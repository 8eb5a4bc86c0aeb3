"""The sequence store's one interface: what every backend keeps, and the rules they share.

A sequence store holds each prompt's rollouts as append-only records (the bytes
`seqrecord.encode` makes: tokens, the tick they were written at, a weight, optionally the
tokens' probabilities) under record keys (cache_store.record_keys), a logical clock, and the
decay settings (cache_store.clock):

    store = open_store(location)                # cache_store.locations: a directory or a URL
    tree = load_tree(store, uid)                # SuffixTree of its newest decayed sequences
    ... stream this group's rollouts into `tree` (tree.stream()) and draft from it ...
    store.append_many({uid: [tokens, ...]})     # writes only the new sequences
    store.tick()                                # once per rollout batch

`SequenceStore` is the base both backends implement: `LmdbSequenceStore` (cache_store.seqstore,
one machine, the default) and `RedisSequenceStore` (cache_store.redis_store, a server every
machine shares). What they do alike lives here once: `select_sequences` (the read's rule:
decay, the floor, corrupt records, the newest-first bounds), checking a batch before it is
written, corrupt-record warnings, stats' memory estimate, and `load_tree`. Copying and merging
between any two stores, and telling a URL from a directory, are cache_store.locations'.
"""

from __future__ import annotations

import sys
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from cache_store import seqrecord, seqstats
from cache_store.clock import decay_factor
from cache_store.errors import CacheError, CorruptRecord, CorruptSequenceWarning
from cache_store.record_keys import key_number, key_uid
from cache_store.seqprune import PruneCriteria, PrunePlan
from cache_store.seqstats import SeqStoreStats
from cache_store.suffix_tree import SuffixTree
from cache_store.uid import is_uid

# A build costs about a microsecond per token and runs inside the engine step that first needs
# the prompt, and a live tree holds ~100 bytes per token, so a load keeps only the prompt's
# newest sequences; the older ones stay in the store until decay or `srt cache prune` removes them.
LOAD_NEWEST = 1 << 17  # sequences a load keeps at most (a suffix tree holds 524,287)
LOAD_TOKENS = 1 << 17  # tokens a load keeps at most (`srt rollout --load-tokens`): 16 x 8,192 tokens
TREE_DEPTH = 64        # the deepest path a prompt's tree keeps: drafts are never longer
SERVER_SCHEMES = ("redis://", "rediss://")  # a cache server's URL, not a directory


def is_server_url(location: object) -> bool:
    """Whether a cache location is a server's URL (else a directory)."""
    return isinstance(location, str) and location.startswith(SERVER_SCHEMES)


@dataclass(frozen=True)
class StoredSequence:
    """One rollout as read back: its tokens, the tick it was written at, its weight now, and
    its tokens' probabilities (None when the record has none)."""

    tokens: Sequence[int]
    tick: int
    weight: float
    probs: Sequence[float] | None = None


def select_sequences(records: Iterable[tuple[bytes, Any]], info: Mapping[str, float],
                     newest: int | None = None, tokens: int | None = None,
                     warn: Callable[[bytes, Exception], None] | None = None) -> tuple[list[StoredSequence], bool]:
    """The read's rule, shared by every backend: (the sequences kept, oldest first; whether a
    bound ended the walk).

    `records` are a prompt's (key, record bytes), in append order for a whole read, newest
    first for a bounded one (`newest` and/or `tokens` given). Weights are decayed to the tick in
    `info` (with its half_life); a sequence below the floor is left out; a corrupt record is
    passed to `warn` and skipped. A bounded walk keeps the newest sequences, at most `newest`
    of them and `tokens` tokens in all (the newest one whatever its length), and stops at the
    first that does not fit, having checked only that one's header and checksum. False for the
    second value means the walk ran out of records: a backend that fetched only some of them
    fetches more and walks again."""
    out: list[StoredSequence] = []
    bounded = newest is not None or tokens is not None
    newest = sys.maxsize if newest is None else newest
    tokens = sys.maxsize if tokens is None else tokens
    now, hl, floor, total = int(info["tick"]), info["half_life"], info["floor"], 0
    stopped = False
    for key, value in records:
        if len(out) >= newest:
            stopped = True
            break
        try:
            head = seqrecord.check(value)
            w = head.weight * decay_factor(now, head.tick, hl)
            if not (w >= floor and w > 0):
                continue
            if out and total + head.tokens > tokens:
                stopped = True
                break
            _, toks, probs = seqrecord.decode_with_probs(value, head)
        except CorruptRecord as e:
            if warn is not None:
                warn(bytes(key), e)
            continue
        total += head.tokens
        out.append(StoredSequence(toks, head.tick, w, probs))
    return (out[::-1] if bounded else out), stopped or len(out) >= newest


def check_uid(uid: str) -> str:
    """`uid`, or ValueError: keys are the uid then a record number, so uids must all have one
    length, 32 hex digits."""
    if not (isinstance(uid, str) and is_uid(uid)):
        raise ValueError(f"not a prompt uid (32 lowercase hex digits): {uid!r}")
    return uid


class SequenceStore(ABC):
    """A sequence store of any backend (see the module docstring).

    The drafters and the tree need `read`, `append_many`, `now` and `tick`; `srt cache` needs
    `prune`, `stats` and `compact`; copying and merging between stores (cache_store.seqtransfer)
    need `info`, `uids`, `raw_records`, `last_writes`, `append_raw` and `adopt_header`. A
    backend provides `path`, `readonly` and the abstract methods."""

    path: Any
    readonly: bool

    def __init__(self) -> None:
        self._warned: set[bytes] = set()

    # -- the clock and the header ---------------------------------------------------------

    @abstractmethod
    def info(self) -> dict[str, float]:
        """The clock (`tick`) and the settings: `half_life`, `floor`, `created`."""

    def now(self) -> int:
        """The logical clock."""
        return int(self.info()["tick"])

    @abstractmethod
    def tick(self, n: int = 1) -> int:
        """Advance the logical clock by `n` (once per rollout batch); the new tick."""

    @abstractmethod
    def adopt_header(self, info: Mapping[str, float]) -> None:
        """Take another store's clock, settings and creation time (the start of a copy into
        this one); CacheError unless this store is empty."""

    # -- writing -------------------------------------------------------------------------

    @abstractmethod
    def append_many(self, batch: Mapping[str, Iterable[Sequence[int]]],
                    probs: Mapping[str, Sequence[Any]] | None = None, append_id: str | None = None) -> None:
        """Store new rollouts (weight 1, stamped now) for each prompt; `probs[uid][i]`, if
        given and not None, are the probabilities of `batch[uid][i]`'s tokens; `append_id`
        makes a retry land once. Empty sequences are skipped; ValueError (nothing written) for
        a bad uid, token id or probability."""

    def append(self, uid: str, sequences: Iterable[Sequence[int]]) -> None:
        """`append_many` for one prompt."""
        self.append_many({uid: sequences})

    @abstractmethod
    def append_raw(self, batch: Mapping[str, Sequence[bytes]], walls: Mapping[str, float] | None = None) -> None:
        """Append records as they are (a copy or an import); `walls[uid]`, if given, is the
        prompt's last write time to keep."""

    # -- reading -------------------------------------------------------------------------

    @abstractmethod
    def read(self, uid: str, newest: int | None = None, tokens: int | None = None) -> list[StoredSequence]:
        """The prompt's sequences, oldest first, decayed to now, those below the floor left
        out, a corrupt one warned of once and skipped; with `newest` and/or `tokens` only the
        newest that fit (`select_sequences`), at a cost of what the read keeps."""

    @abstractmethod
    def uids(self) -> list[str]:
        """The prompts holding records."""

    @abstractmethod
    def raw_records(self, uid: str) -> list[tuple[bytes, bytes]]:
        """(record key, record bytes) of a prompt's records, in append order."""

    @abstractmethod
    def last_writes(self) -> dict[str, float]:
        """Each prompt's last write time (unix seconds)."""

    # -- maintenance (`srt cache`) --------------------------------------------------------

    @abstractmethod
    def prune(self, criteria: PruneCriteria | None = None, dry_run: bool = False) -> PrunePlan:
        """Remove what `criteria` selects (cache_store.seqprune; default: the sequences below
        the floor), or with `dry_run` report it and change nothing."""

    @abstractmethod
    def stats(self, verify: bool = True, top: int = 5) -> SeqStoreStats:
        """What `srt cache stats` reports (cache_store.seqstats)."""

    @abstractmethod
    def compact(self) -> tuple[int, int]:
        """Shrink what the store takes: (bytes before, after); CacheError where it cannot."""

    @abstractmethod
    def check_compactable(self) -> None:
        """CacheError now if `compact` would be refused (checked before a prune deletes)."""

    @abstractmethod
    def close(self) -> None: ...

    # -- shared by the backends ------------------------------------------------------------

    def _prepared(self, batch: Mapping[str, Iterable[Sequence[int]]],
                  probs: Mapping[str, Sequence[Any]] | None) -> dict[str, list[tuple]]:
        """Each prompt's non-empty sequences as (int32 tokens, probability bytes or None);
        ValueError (before anything is written) for a bad uid, token id or probability."""
        self._writable()
        return {check_uid(uid): _with_probs(seqs, (probs or {}).get(uid)) for uid, seqs in batch.items()}

    def _warn(self, key: bytes, e: Exception) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"{self.path}: sequence {key_number(key)} of {key_uid(key)} is corrupt ({e}); skipped "
                          "(`srt cache prune --drop-corrupt` removes it)", CorruptSequenceWarning, stacklevel=4)

    def _with_memory(self, st: SeqStoreStats, top: int) -> SeqStoreStats:
        """The loaded-memory estimate (from loading the largest prompt), the `top` largest kept."""
        seqstats.estimate_memory(st, self._loaded_bytes)
        st.largest = st.largest[:top]
        return st

    def _loaded_bytes(self, uid: str) -> tuple[int, int]:
        """(memory, tokens) of one loaded tree; silent, so a later read still warns of a
        corrupt record it skips (stats counts those anyway)."""
        warned = set(self._warned)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CorruptSequenceWarning)
            tree = load_tree(self, uid)
        self._warned = warned
        return tree.memory_bytes(), tree.stats().tokens

    def _writable(self) -> None:
        if self.readonly:
            raise CacheError(f"{self.path}: opened read-only")

    def __enter__(self) -> SequenceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_probs(seqs: Iterable[Sequence[int]], probs: Sequence[Any] | None) -> list[tuple]:
    """(int32 tokens, probability bytes from `seqrecord.as_probs` or None) of each non-empty
    sequence."""
    seqs = [seqrecord.as_tokens(s) for s in seqs]
    probs = [None] * len(seqs) if probs is None else list(probs)
    if len(probs) != len(seqs):
        raise ValueError(f"probs for {len(probs)} sequences, but {len(seqs)} sequences")
    return [(a, None if p is None else seqrecord.as_probs(p, a.size)) for a, p in zip(seqs, probs) if a.size]


def load_tree(store: SequenceStore, uid: str, max_depth: int = TREE_DEPTH, newest: int = LOAD_NEWEST,
              tokens: int = LOAD_TOKENS) -> SuffixTree:
    """The prompt's tree: its newest stored sequences above the floor (at most `newest` of them
    and `tokens` tokens in all), weighted by their decay."""
    seqs = store.read(uid, newest, tokens)
    return SuffixTree.from_sequences(((s.tokens, s.weight, s.probs) for s in seqs), max_depth)
