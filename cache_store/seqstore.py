"""The sequence store: each prompt's rollouts as append-only records, the tree rebuilt on load.

srt's cache format (docs/cache.md, "The sequence store"). Instead of one tree record per prompt that every commit decodes, merges and rewrites, it keeps
the rollouts themselves (token arrays with the tick they were written at and a weight):

    store = LmdbSequenceStore.open(path)        # creates the store if needed
    tree = load_tree(store, uid)                # SuffixTree of its newest decayed sequences
    ... stream this group's rollouts into `tree` (tree.stream()) and draft from it ...
    store.append_many({uid: [tokens, ...]})     # writes only the new sequences
    store.tick()                                # once per rollout batch

A commit costs what it writes, whatever the prompt already holds, and writers never need to
merge: every append takes the next record numbers of its prompts inside its own LMDB write
transaction (LMDB serialises writers), so concurrent writers lose nothing. Decay is per
sequence: a record written at tick s with weight w weighs w * 0.5 ** ((now - s) / half_life)
at tick now; a sequence whose weight is below the floor is left out of loads and removed by
`prune`. The maintenance operations behind `srt cache` (prune with every criterion and a dry
run, stats, compact, export, import) live in seqprune, seqstats and seqtransfer; this class is
their one entry point. `SequenceStore` is the narrow interface the tree and the drafters use.

A second backend, `RedisSequenceStore` (cache_store.redis_store), keeps the same records on a
server every machine shares. What both do alike lives here once: `select_sequences` (the read's
rule: decay, the floor, corrupt records, the newest-first bounds) and `StoreBase` (checking a
batch before it is written, warnings, stats' memory estimate).
"""

from __future__ import annotations

import os
import struct
import sys
import time
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import lmdb

from cache_store import seqrecord
from cache_store.clock import DEFAULT_FLOOR, DEFAULT_HALF_LIFE, check_settings, decay_factor
from cache_store import seqprune, seqstats, seqtransfer
from cache_store.errors import CacheError, CorruptRecord, CorruptTreeWarning
from cache_store.seqenv import META, SeqEnv, open_seq_env, record_key
from cache_store.seqprune import PruneCriteria, PrunePlan
from cache_store.seqstats import PromptSummary, SeqStoreStats
from cache_store.seqtransfer import ImportReport

__all__ = ["LOAD_NEWEST", "LOAD_TOKENS", "ImportReport", "LmdbSequenceStore", "PromptSummary", "PruneCriteria",
           "PrunePlan", "SeqStoreStats", "SequenceStore", "StoreBase", "StoredSequence", "check_uid", "load_tree",
           "select_sequences"]
from cache_store.suffix_tree import SuffixTree
from cache_store.uid import is_uid

# A build costs about a microsecond per token and runs inside the engine step that first needs
# the prompt, and a live tree holds ~100 bytes per token, so a load keeps only the prompt's
# newest sequences; the older ones stay in the store until decay or `srt cache prune` removes them.
LOAD_NEWEST = 1 << 17  # sequences a load keeps at most (a suffix tree holds 524,287)
LOAD_TOKENS = 1 << 17  # tokens a load keeps at most (`srt rollout --load-tokens`): 16 x 8,192 tokens
SERVER_SCHEMES = ("redis://", "rediss://")  # a cache server's URL (cache_store.redis_store), not a directory

@dataclass(frozen=True)
class StoredSequence:
    """One rollout as read back: its tokens, the tick it was written at, its weight now, and
    its tokens' probabilities (None when the record has none)."""

    tokens: Sequence[int]
    tick: int
    weight: float
    probs: Sequence[float] | None = None


class SequenceStore(Protocol):
    """What the tree and the drafters need of persistence."""

    def append(self, uid: str, sequences: Iterable[Sequence[int]]) -> None: ...
    def append_many(self, batch: Mapping[str, Iterable[Sequence[int]]],
                    probs: Mapping[str, Sequence[Any]] | None = None, append_id: str | None = None) -> None: ...
    def read(self, uid: str, newest: int | None = None, tokens: int | None = None) -> list[StoredSequence]: ...
    def prune(self, criteria: PruneCriteria | None = None, dry_run: bool = False) -> PrunePlan: ...
    def stats(self, verify: bool = True, top: int = 5) -> SeqStoreStats: ...
    def now(self) -> int: ...
    def tick(self, n: int = 1) -> int: ...


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


class StoreBase(ABC):
    """What every backend's store shares: checking a batch before it is written, the clock's
    reading, corrupt-record warnings (once per record), stats' memory estimate, and closing
    as a context manager. A backend provides `path`, `readonly` and the abstract methods."""

    path: Any
    readonly: bool

    def __init__(self) -> None:
        self._warned: set[bytes] = set()

    @abstractmethod
    def info(self) -> dict[str, float]: ...

    @abstractmethod
    def read(self, uid: str, newest: int | None = None, tokens: int | None = None) -> list[StoredSequence]: ...

    @abstractmethod
    def close(self) -> None: ...

    def now(self) -> int:
        return int(self.info()["tick"])

    def append(self, uid: str, sequences: Iterable[Sequence[int]]) -> None:
        """`append_many` for one prompt."""
        self.append_many({uid: sequences})

    @abstractmethod
    def append_many(self, batch: Mapping[str, Iterable[Sequence[int]]],
                    probs: Mapping[str, Sequence[Any]] | None = None, append_id: str | None = None) -> None: ...

    def _prepared(self, batch: Mapping[str, Iterable[Sequence[int]]],
                  probs: Mapping[str, Sequence[Any]] | None) -> dict[str, list[tuple]]:
        """Each prompt's non-empty sequences as (int32 tokens, probability bytes or None);
        ValueError (before anything is written) for a bad uid, token id or probability."""
        self._writable()
        return {check_uid(uid): _with_probs(seqs, (probs or {}).get(uid)) for uid, seqs in batch.items()}

    def _warn(self, key: bytes, e: Exception) -> None:
        if key not in self._warned:
            self._warned.add(key)
            uid, n = key[:-4].decode(errors="replace"), struct.unpack(">I", key[-4:])[0]
            warnings.warn(f"{self.path}: sequence {n} of {uid} is corrupt ({e}); skipped "
                          "(`srt cache prune --drop-corrupt` removes it)", CorruptTreeWarning, stacklevel=4)

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
            warnings.simplefilter("ignore", CorruptTreeWarning)
            tree = load_tree(self, uid)
        self._warned = warned
        return tree.memory_bytes(), tree.stats().tokens

    def _writable(self) -> None:
        if self.readonly:
            raise CacheError(f"{self.path}: opened read-only")

    def __enter__(self) -> StoreBase:
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


def _key(uid: str, n: int) -> bytes:
    return record_key(uid.encode(), n)


def check_uid(uid: str) -> str:
    """`uid`, or ValueError: keys are the uid then a record number, so uids must all have one
    length, 32 hex digits."""
    if not (isinstance(uid, str) and is_uid(uid)):
        raise ValueError(f"not a prompt uid (32 lowercase hex digits): {uid!r}")
    return uid


class LmdbSequenceStore(StoreBase):
    """A sequence store in one LMDB environment (see the module docstring)."""

    def __init__(self, env: SeqEnv) -> None:
        super().__init__()
        self._e = env

    @classmethod
    def open(cls, path: str | Path, create: bool = True, readonly: bool = False,
             half_life: float = DEFAULT_HALF_LIFE, floor: float = DEFAULT_FLOOR) -> LmdbSequenceStore:
        """Open (or create) the store at `path`; half_life/floor apply only when creating it.

        Raises NotACacheError for anything that is not an srt cache (left untouched),
        OldFormatError for srt's earlier tree-format cache, FormatVersionError for a newer one,
        NetworkFilesystemError on a network or FUSE filesystem.
        """
        check_settings(half_life, floor)
        return cls(open_seq_env(Path(path), create, readonly, half_life, floor))

    @property
    def path(self) -> Path:
        return self._e.path

    @property
    def readonly(self) -> bool:
        return self._e.readonly

    def info(self) -> dict[str, float]:
        return self._e.read(self._e.get_info)

    def tick(self, n: int = 1) -> int:
        """Advance the logical clock by `n` (once per rollout batch); the new tick."""
        if n < 0:
            raise ValueError("the clock never goes back")

        def fn(txn: lmdb.Transaction) -> int:
            now = int(self._e.get_info(txn)["tick"]) + n
            self._e.set_tick(txn, now)
            return now

        return self._e.write(fn)

    # -- writing -------------------------------------------------------------------------

    def append_many(self, batch: Mapping[str, Iterable[Sequence[int]]],
                    probs: Mapping[str, Sequence[Any]] | None = None, append_id: str | None = None) -> None:
        """Store new rollouts (weight 1, stamped now) for each prompt, in one transaction;
        `append_id` makes a retry idempotent on a server; one transaction here either commits
        or leaves nothing, so it needs none. `probs[uid][i]`, if given and not None, are the
        probabilities of `batch[uid][i]`'s
        tokens (`seqrecord.as_probs`).

        Everything is validated and compressed before the write lock is taken; inside it,
        each prompt's next record numbers are read and its meta record updated. Empty
        sequences are skipped. ValueError (nothing written) for a token id out of range or a
        probability outside [0, 1].
        """
        arrays = self._prepared(batch, probs)
        now = self.now()
        encoded = {uid: [seqrecord.encode(a, now, 1.0, p) for a, p in arr] for uid, arr in arrays.items()}

        def fn(txn: lmdb.Transaction) -> None:
            tick = int(self._e.get_info(txn)["tick"])
            for uid, recs in encoded.items():
                if tick != now:  # the clock moved since encoding: stamp the records now
                    recs = [seqrecord.encode(a, tick, 1.0, p) for a, p in arrays[uid]]
                if recs:
                    self._put(txn, uid, recs, sum(a.size for a, _ in arrays[uid]))

        self._e.write(fn)

    def append_raw(self, batch: Mapping[str, Sequence[bytes]], walls: Mapping[str, float] | None = None) -> None:
        """Append records as they are (a copy or an import, cache_store.seqtransfer) in one
        transaction; `walls[uid]`, if given, is the prompt's last write time to keep."""
        self._writable()
        self._e.write(lambda txn: [self._put(txn, check_uid(uid), list(recs), sum(map(seqrecord.peek_tokens, recs)),
                                             (walls or {}).get(uid)) for uid, recs in batch.items() if recs])

    def _put(self, txn: lmdb.Transaction, uid: str, recs: list[bytes], tokens: int, wall: float | None = None) -> None:
        nxt, seqs, toks, _wall, nbytes = self._e.get_meta(txn, uid.encode())
        for i, rec in enumerate(recs):
            if not txn.put(_key(uid, nxt + i), rec, db=self._e.dbs["seqs"], overwrite=False):
                raise CacheError(f"{self.path}: record {nxt + i} of {uid} already exists (meta out of step)")
        meta = (nxt + len(recs), seqs + len(recs), toks + tokens, time.time() if wall is None else wall,
                nbytes + sum(map(len, recs)))
        self._e.put_meta(txn, uid.encode(), meta)

    def adopt_header(self, info: Mapping[str, float]) -> None:
        """Take another store's clock, settings and creation time (the start of a copy into
        this one); CacheError unless this store is empty."""
        self._writable()

        def fn(txn: lmdb.Transaction) -> None:
            if txn.stat(self._e.dbs["seqs"])["entries"]:
                raise CacheError(f"{self.path}: not empty; a copy goes into an empty cache (import merges)")
            for k, f in ((b"half_life", "<d"), (b"floor", "<d"), (b"created", "<d")):
                txn.put(k, struct.pack(f, info[k.decode()]), db=self._e.dbs["info"])
            self._e.set_tick(txn, int(info["tick"]))

        self._e.write(fn)

    # -- reading -------------------------------------------------------------------------

    def read(self, uid: str, newest: int | None = None, tokens: int | None = None) -> list[StoredSequence]:
        """The prompt's sequences, oldest first, with their weights decayed to now, those below
        the floor left out; a corrupt record warns (once) and is skipped.

        With `newest` and/or `tokens`: only the newest of those sequences, at most `newest` of
        them and `tokens` tokens in all (the newest one whatever its length). The records are
        then walked newest first and the walk stops at the bound, and headers carry the token
        counts, so the read costs what it keeps, not all that the prompt has stored
        (`select_sequences`)."""
        check_uid(uid)
        bounded = newest is not None or tokens is not None

        def fn(txn: lmdb.Transaction) -> list[StoredSequence]:
            records = self._e.records(txn, uid.encode(), newest_first=bounded)
            return select_sequences(records, self._e.get_info(txn), newest, tokens, self._warn)[0]

        return self._e.read(fn, buffers=True)

    def uids(self) -> list[str]:
        return self._e.read(lambda txn: [bytes(k).decode() for k in txn.cursor(db=self._e.dbs["meta"]).iternext(values=False)])

    def last_writes(self) -> dict[str, float]:
        """Each prompt's last write time (unix seconds)."""
        metas = self._e.read(lambda txn: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=self._e.dbs["meta"])])
        return {k.decode(): META.unpack(v)[3] for k, v in metas if len(v) == META.size}

    def raw_records(self, uid: str) -> list[tuple[bytes, bytes]]:
        """(key, record bytes) of a prompt's records (for tools and tests)."""
        return self._e.read(lambda txn: [(k, bytes(v)) for k, v in self._e.records(txn, uid.encode())], buffers=True)

    def put_raw(self, key: bytes, value: bytes) -> None:
        """Overwrite one record's bytes as they are (for tests of corruption handling)."""
        self._e.write(lambda txn: txn.put(key, value, db=self._e.dbs["seqs"]))

    # -- maintenance (`srt cache`) --------------------------------------------------------

    def prune(self, criteria: PruneCriteria | None = None, dry_run: bool = False) -> PrunePlan:
        """Remove what `criteria` selects (seqprune; default: only the sequences below the
        floor) in one write transaction, or with `dry_run` report it and change nothing."""
        crit = criteria or PruneCriteria()
        if dry_run:
            return self._e.read(lambda txn: seqprune.plan(seqprune.lmdb_prompts(self._e, txn),
                                                          self._e.get_info(txn), crit)[0])
        self._writable()
        return self._e.write(lambda txn: seqprune.apply(self._e, txn, crit))

    def stats(self, verify: bool = True, top: int = 5) -> SeqStoreStats:
        """What `srt cache stats` reports (seqstats): counts from the meta records, with
        `verify` every record's CRC (corrupt None without), the `top` largest prompts, and
        the loaded-memory estimate from loading the largest prompt."""
        return self._with_memory(seqstats.collect(self._e, verify, max(top, 1)), top)

    def compact(self) -> tuple[int, int]:
        """Shrink the data file (seqtransfer.compact): (bytes before, after); CacheBusyError
        unless this is the directory's only open."""
        self._writable()
        return seqtransfer.compact(self._e)

    def check_compactable(self) -> None:
        """CacheBusyError now if `compact` would be refused (checked before a prune deletes)."""
        self._writable()
        seqtransfer.check_compactable(self._e)

    def export(self, dst: str | Path | StoreBase) -> int:
        """A copy of this cache. `dst` a directory (new, or empty): a compacted, portable LMDB
        copy; its data file's size (CacheError, nothing written, if it exists and is not an
        empty directory). `dst` an open store of any backend, empty: every record as it is,
        with the clock and settings (seqtransfer.copy_store); the record bytes copied."""
        if isinstance(dst, (str, Path)):
            return seqtransfer.export(self._e, _directory(dst))
        return seqtransfer.copy_store(self, dst).bytes

    def import_from(self, src: str | Path | StoreBase) -> ImportReport:
        """Append every sequence of the store at `src` (a directory, or an open store of any
        backend), each keeping its age and weight (seqtransfer.merge_store), in one write
        transaction; OldFormatError for an old tree-format cache."""
        self._writable()
        if not isinstance(src, (str, Path)):
            return seqtransfer.merge_store(src, self)
        if os.path.realpath(_directory(src)) == os.path.realpath(self.path):
            raise CacheError(f"{src}: cannot import a cache into itself")
        with LmdbSequenceStore.open(src, create=False, readonly=True) as source:
            return seqtransfer.merge_store(source, self)

    def close(self) -> None:
        self._e.release()


def _directory(location: str | Path) -> str | Path:
    """`location`, an LMDB directory; CacheError for a server URL, which the LMDB store does not
    open itself (cache_store.redis_store imports this module): open it and pass the store."""
    if isinstance(location, str) and location.startswith(SERVER_SCHEMES):
        raise CacheError("a cache server's URL is not a directory: pass the server's open store "
                         "(RedisSequenceStore.open(url)) instead")
    return location


def load_tree(store: SequenceStore, uid: str, max_depth: int = 64, newest: int = LOAD_NEWEST,
              tokens: int = LOAD_TOKENS) -> SuffixTree:
    """The prompt's tree: its newest stored sequences above the floor (at most `newest` of them
    and `tokens` tokens in all), weighted by their decay."""
    seqs = store.read(uid, newest, tokens)
    return SuffixTree.from_sequences(((s.tokens, s.weight, s.probs) for s in seqs), max_depth)
