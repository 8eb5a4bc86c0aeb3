"""What a sequence store holds: the figures `srt cache stats` prints (and its --json object).

Counts and sizes come from the meta records; with `verify` every record's CRC is checked too
(all record bytes are read, from LMDB's memory map, nothing decompressed). "Bytes in memory
when loaded" is an estimate: the largest prompt is loaded (its tree built from the sequences
above the floor) and its `SuffixTree.memory_bytes()` per stored token is multiplied by the
tokens of the whole store. One prompt's tree is a fair sample because the suffix tree's size
is nearly linear in tokens (about 1.6 nodes a token), and loading only one keeps stats cheap.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import lmdb

from cache_store import seqrecord
from cache_store.errors import CorruptRecord
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
    disk_bytes: int = 0         # the data file (never shrinks until compacted)
    used_bytes: int = 0         # LMDB pages in use
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


def _add_meta(st: SeqStoreStats, largest: list, top: int, uid: str, raw: bytes) -> None:
    _n, seqs, toks, wall, nbytes = META.unpack(raw)
    st.prompts += 1
    st.sequences, st.tokens, st.record_bytes = st.sequences + seqs, st.tokens + toks, st.record_bytes + nbytes
    st.oldest_write = wall if st.oldest_write is None else min(st.oldest_write, wall)
    st.newest_write = wall if st.newest_write is None else max(st.newest_write, wall)
    item = (nbytes, uid, PromptSummary(uid, seqs, toks, nbytes, wall))
    if len(largest) < top:
        heapq.heappush(largest, item)
    elif top:
        heapq.heappushpop(largest, item)


def _verify(st: SeqStoreStats, env: SeqEnv, txn: lmdb.Transaction) -> None:
    for key, value in txn.cursor(db=env.dbs["seqs"]):
        try:
            seqrecord.check(value)
        except CorruptRecord:
            st.corrupt += 1
            uid = bytes(key[:-4]).decode(errors="replace")
            if len(st.corrupt_uids) < MAX_CORRUPT_UIDS and uid not in st.corrupt_uids:
                st.corrupt_uids.append(uid)


def _used_bytes(env: SeqEnv, txn: lmdb.Transaction) -> int:
    stats = [env.env.stat()] + [txn.stat(db) for db in env.dbs.values()]
    return sum((s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * s["psize"] for s in stats)


def collect(env: SeqEnv, verify: bool, top: int) -> SeqStoreStats:
    """One read snapshot summarised (without the memory estimate)."""
    st = SeqStoreStats(path=str(env.path))
    largest: list = []

    def fn(txn: lmdb.Transaction) -> None:
        info = env.get_info(txn)
        st.tick, st.half_life, st.floor = int(info["tick"]), info["half_life"], info["floor"]
        for key, raw in txn.cursor(db=env.dbs["meta"]):
            if len(raw) == META.size:
                _add_meta(st, largest, top, bytes(key).decode(), bytes(raw))
        if verify:
            _verify(st, env, txn)
        st.used_bytes = _used_bytes(env, txn)

    env.read(fn, buffers=True)
    st.largest = [s for *_, s in sorted(largest, reverse=True)]
    st.corrupt = st.corrupt if verify else None
    st.disk_bytes = os.path.getsize(env.path / "data.mdb")
    return st


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
