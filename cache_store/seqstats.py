"""What a sequence store holds: the figures `srt cache stats` prints (and its --json object).

Counts and sizes come from the meta records; with `verify` every record's CRC is checked too
(all record bytes are read, from LMDB's memory map, nothing decompressed). "Bytes in memory
when loaded" is an estimate: the largest prompt is loaded (its tree built from the sequences
above the floor) and its `SuffixTree.memory_bytes()` per stored token is multiplied by the
tokens of the whole store. One prompt's tree is a fair sample because the suffix tree's size
is nearly linear in tokens (about 1.6 nodes a token), and loading only one keeps stats cheap.

The summing is shared by the backends (`Summary`: feed it each prompt's meta figures and, when
verifying, its records); LMDB's `collect` reads them in one snapshot, a cache server's store
(cache_store.redis_store) in pipelined batches.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import lmdb

from cache_store import seqrecord
from cache_store.errors import CorruptRecord
from cache_store.record_keys import key_uid
from cache_store.seqenv import META, SeqEnv

MAX_CORRUPT_UIDS = 20


@dataclass
class PromptSummary:
    """One prompt as `stats` lists the largest ones (by record bytes)."""

    uid: str
    sequences: int
    tokens: int
    disk_bytes: int
    last_write: float


@dataclass
class SeqStoreStats:
    """The numbers `srt cache stats` prints."""

    path: str
    prompts: int = 0
    sequences: int = 0
    tokens: int = 0
    record_bytes: int = 0       # stored sequence records (compressed)
    disk_bytes: int = 0         # LMDB: the data file (never shrinks until compacted); a cache
                                # server: the server memory its keys take (MEMORY USAGE), or the
                                # record bytes where the server refuses MEMORY
    used_bytes: int = 0         # LMDB: pages in use; a cache server: as disk_bytes
    tick: int = 0
    half_life: float = 0.0
    floor: float = 0.0
    corrupt: int | None = 0     # None: not checked (verify=False)
    corrupt_uids: list[str] = field(default_factory=list)  # the first MAX_CORRUPT_UIDS
    oldest_write: float | None = None
    newest_write: float | None = None
    memory_per_token: float | None = None  # bytes of a loaded tree per stored token (estimate)
    memory_bytes: int | None = None        # memory_per_token x tokens
    largest: list[PromptSummary] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Summary:
    """Sums prompts' meta figures and checks their records into a SeqStoreStats."""

    def __init__(self, st: SeqStoreStats, verify: bool, top: int) -> None:
        self.st, self.verify, self.top, self.largest = st, verify, top, []

    def add_meta(self, uid: str, seqs: int, toks: int, wall: float, nbytes: int) -> None:
        st = self.st
        st.prompts += 1
        st.sequences, st.tokens, st.record_bytes = st.sequences + seqs, st.tokens + toks, st.record_bytes + nbytes
        st.oldest_write = wall if st.oldest_write is None else min(st.oldest_write, wall)
        st.newest_write = wall if st.newest_write is None else max(st.newest_write, wall)
        item = (nbytes, uid, PromptSummary(uid, seqs, toks, nbytes, wall))
        if len(self.largest) < self.top:
            heapq.heappush(self.largest, item)
        elif self.top:
            heapq.heappushpop(self.largest, item)

    def add_records(self, records: Iterable[tuple[bytes, Any]]) -> None:
        """Count the corrupt ones among records (key = uid + number, record bytes)."""
        st = self.st
        for key, value in records:
            try:
                seqrecord.check(value)
            except CorruptRecord:
                st.corrupt += 1
                uid = key_uid(key)
                if len(st.corrupt_uids) < MAX_CORRUPT_UIDS and uid not in st.corrupt_uids:
                    st.corrupt_uids.append(uid)

    def done(self) -> SeqStoreStats:
        self.st.largest = [s for *_, s in sorted(self.largest, reverse=True)]
        self.st.corrupt = self.st.corrupt if self.verify else None
        return self.st


def _used_bytes(env: SeqEnv, txn: lmdb.Transaction) -> int:
    stats = [env.env.stat()] + [txn.stat(db) for db in env.dbs.values()]
    return sum((s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * s["psize"] for s in stats)


def collect(env: SeqEnv, verify: bool, top: int) -> SeqStoreStats:
    """One LMDB read snapshot summarised (without the memory estimate)."""
    sm = Summary(SeqStoreStats(path=str(env.path)), verify, top)

    def fn(txn: lmdb.Transaction) -> None:
        info = env.get_info(txn)
        sm.st.tick, sm.st.half_life, sm.st.floor = int(info["tick"]), info["half_life"], info["floor"]
        for key, raw in txn.cursor(db=env.dbs["meta"]):
            if len(raw) == META.size:
                sm.add_meta(bytes(key).decode(), *META.unpack(raw)[1:])
        if verify:
            sm.add_records(txn.cursor(db=env.dbs["seqs"]))
        sm.st.used_bytes = _used_bytes(env, txn)

    env.read(fn, buffers=True)
    sm.st.disk_bytes = os.path.getsize(env.path / "data.mdb")
    return sm.done()


def estimate_memory(st: SeqStoreStats, loaded_bytes: Callable[[str], tuple[int, int]]) -> None:
    """Fill the memory estimate from the largest prompt; `loaded_bytes(uid)` gives (tree
    memory bytes, tokens loaded) of one prompt's tree."""
    by_tokens = max(st.largest, key=lambda s: s.tokens, default=None)
    if by_tokens is None:
        return
    memory, tokens = loaded_bytes(by_tokens.uid)
    if tokens:
        st.memory_per_token = memory / tokens
        st.memory_bytes = round(st.memory_per_token * st.tokens)
