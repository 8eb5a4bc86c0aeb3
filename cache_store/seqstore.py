"""The sequence store in one LMDB environment: the default backend, for one machine.

srt's cache format (docs/cache.md, "The sequence store"). Instead of one tree record per prompt
that every commit decodes, merges and rewrites, it keeps the rollouts themselves (token arrays
with the tick they were written at and a weight), under the interface every backend shares
(cache_store.store.SequenceStore):

    store = LmdbSequenceStore.open(path)        # creates the store if needed

A commit costs what it writes, whatever the prompt already holds, and writers never need to
merge: every append takes the next record numbers of its prompts inside its own LMDB write
transaction (LMDB serialises writers), so concurrent writers lose nothing. Decay is per
sequence: a record written at tick s with weight w weighs w * 0.5 ** ((now - s) / half_life)
at tick now (cache_store.clock); a sequence whose weight is below the floor is left out of
loads and removed by `prune`. The maintenance operations behind `srt cache` (prune with every
criterion and a dry run, stats, compact, a compacted copy) live in seqprune, seqstats and
seqtransfer; this class is their one entry point for LMDB.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import lmdb

from cache_store import seqprune, seqrecord, seqstats, seqtransfer
from cache_store.clock import DEFAULT_FLOOR, DEFAULT_HALF_LIFE, check_settings
from cache_store.errors import CacheError
from cache_store.record_keys import record_key
from cache_store.seqenv import META, SeqEnv, open_seq_env
from cache_store.seqprune import PruneCriteria, PrunePlan
from cache_store.seqstats import SeqStoreStats
from cache_store.store import SequenceStore, StoredSequence, check_uid, select_sequences


class LmdbSequenceStore(SequenceStore):
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
            if not txn.put(record_key(uid, nxt + i), rec, db=self._e.dbs["seqs"], overwrite=False):
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

    def export_compacted(self, dst: str | Path) -> int:
        """A compacted, portable LMDB copy of this cache in the directory `dst` (new, or empty):
        its data file's size; CacheError, nothing written, if `dst` exists and is not an empty
        directory."""
        return seqtransfer.export(self._e, Path(dst))

    def close(self) -> None:
        self._e.release()

