"""Pruning a sequence store: what `srt cache prune` removes, planned and applied in one go.

Criteria combine, applied in this order (each sees what the previous ones left):
1. `drop_corrupt`: records that fail their checksum (otherwise they are kept and counted);
2. `older_than`: whole prompts not written for that many seconds (wall clock, meta record);
3. the weight threshold: every sequence whose decayed weight is below
   max(the store's floor, `min_count`). Below the floor a sequence is never loaded, so every
   prune removes those; `min_count` X raises the bar (it used to mean "nodes whose count is
   below X"; a sequence store has no per-node counts, so it now means sequences);
4. `max_prompts` / `max_bytes`: LRU over prompts by their last write time: whole prompts go,
   least recently written first, until at most N prompts / N bytes of records remain.

The rules are one function for every backend: `plan` takes each prompt's last write time and
records (key, bytes) from whatever scanned them and returns the plan, the keys of the records
it deletes and what each prompt keeps. Only record headers and checksums are read: nothing is
decompressed. Each backend scans and deletes in its own way: LMDB's (`lmdb_prompts`, `apply`)
plans again inside the write transaction that deletes, so an append committed after a dry run
is judged by the same rules, never lost half-way; a cache server's (cache_store.redis_store)
deletes exactly the planned records by number, so appends made meanwhile stay. A prompt left
without sequences loses its meta record. LMDB's data file does not shrink until compacted (it
reuses the freed pages for later appends).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import lmdb

from cache_store import seqrecord
from cache_store.clock import decay_factor
from cache_store.errors import CorruptRecord
from cache_store.record_keys import key_prompt
from cache_store.seqenv import META, SeqEnv


@dataclass
class PruneCriteria:
    """What to prune (None = criterion not used); the store's floor always applies."""

    max_bytes: int | None = None
    max_prompts: int | None = None
    older_than: float | None = None  # seconds since the prompt's last write
    min_count: float | None = None   # decayed weight below which a sequence goes
    drop_corrupt: bool = False
    floor: float | None = None       # None: the store's floor


@dataclass
class PrunePlan:
    """What a prune removes (totals, and uids per reason) and what remains."""

    prompts: int = 0            # prompts removed whole
    sequences: int = 0          # records removed (whole prompts' included)
    tokens: int = 0
    bytes: int = 0              # record bytes removed
    corrupt: int = 0            # corrupt records removed
    light: int = 0              # sequences removed for their weight
    old: list[str] = field(default_factory=list)   # prompts removed by `older_than`
    lru: list[str] = field(default_factory=list)   # prompts evicted by the budgets
    prompts_after: int = 0
    sequences_after: int = 0
    bytes_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PromptPlan:
    """One prompt during planning: its last write and the records that stay so far."""

    wall: float
    keep: list[tuple[bytes, int, int]] = field(default_factory=list)  # key, tokens, bytes
    had: int = 0


# (uid, last write time, its records as (key, record bytes)), as a backend scans them
ScannedPrompt = tuple[str, float, Iterable[tuple[bytes, Any]]]


def _scan(prompts: Iterable[ScannedPrompt], info: Mapping[str, float], crit: PruneCriteria, plan: PrunePlan,
          doomed: list[bytes]) -> dict[str, PromptPlan]:
    """Steps 1 and 3 per record; every prompt with what it keeps."""
    now, hl = int(info["tick"]), info["half_life"]
    bar = max(info["floor"] if crit.floor is None else crit.floor, crit.min_count or 0.0)
    out: dict[str, PromptPlan] = {}
    for uid, wall, records in prompts:
        p = out[uid] = PromptPlan(wall=wall)
        for key, value in records:
            p.had += 1
            try:
                head = seqrecord.check(value)
            except CorruptRecord:
                if crit.drop_corrupt:
                    _remove(plan, doomed, bytes(key), 0, len(value))
                    plan.corrupt += 1
                else:
                    p.keep.append((bytes(key), 0, len(value)))
                continue
            if head.weight * decay_factor(now, head.tick, hl) < bar:
                _remove(plan, doomed, bytes(key), head.tokens, len(value))
                plan.light += 1
            else:
                p.keep.append((bytes(key), head.tokens, len(value)))
    return out


def _remove(plan: PrunePlan, doomed: list[bytes], key: bytes, tokens: int, nbytes: int) -> None:
    doomed.append(key)
    plan.sequences, plan.tokens, plan.bytes = plan.sequences + 1, plan.tokens + tokens, plan.bytes + nbytes


def _drop_prompt(plan: PrunePlan, doomed: list[bytes], p: PromptPlan) -> None:
    for key, tokens, nbytes in p.keep:
        _remove(plan, doomed, key, tokens, nbytes)
    p.keep = []


def _select(prompts: dict[str, PromptPlan], crit: PruneCriteria, plan: PrunePlan,
            doomed: list[bytes], wall_now: float) -> None:
    """Steps 2 and 4: whole prompts by age, then LRU to the budgets."""
    live = []
    for uid, p in prompts.items():
        if crit.older_than is not None and p.keep and p.wall < wall_now - crit.older_than:
            plan.old.append(uid)
            _drop_prompt(plan, doomed, p)
        elif p.keep:
            live.append((p.wall, uid, p))
    live.sort()  # least recently written first
    count, total = len(live), sum(b for *_, p in live for *_, b in p.keep)
    for _wall, uid, p in live:
        if not ((crit.max_prompts is not None and count > crit.max_prompts)
                or (crit.max_bytes is not None and total > crit.max_bytes)):
            break
        total -= sum(b for *_, b in p.keep)
        count -= 1
        plan.lru.append(uid)
        _drop_prompt(plan, doomed, p)
    plan.prompts = sum(1 for p in prompts.values() if p.had and not p.keep)
    plan.prompts_after, plan.bytes_after = count, total
    plan.sequences_after = sum(len(p.keep) for p in prompts.values())


def plan(prompts: Iterable[ScannedPrompt], info: Mapping[str, float], crit: PruneCriteria,
         wall_now: float | None = None) -> tuple[PrunePlan, list[bytes], dict[str, PromptPlan]]:
    """(the plan, the record keys it deletes, every prompt with what stays) for the scanned
    prompts (`info`: the store's tick, half_life and floor); reads only."""
    out, doomed = PrunePlan(), []
    scanned = _scan(prompts, info, crit, out, doomed)
    _select(scanned, crit, out, doomed, time.time() if wall_now is None else wall_now)
    return out, doomed, scanned


# -- LMDB's scan and delete -------------------------------------------------------------------

def lmdb_prompts(env: SeqEnv, txn: lmdb.Transaction) -> Iterator[ScannedPrompt]:
    """Every prompt's records in one cursor pass (they are adjacent, keyed uid + number)."""
    cursor = txn.cursor(db=env.dbs["seqs"])
    for uid, records in itertools.groupby(cursor, key=lambda kv: key_prompt(kv[0])):
        yield uid.decode(), _last_write(txn, env, uid), records


def _last_write(txn: lmdb.Transaction, env: SeqEnv, uid: bytes) -> float:
    raw = txn.get(uid, db=env.dbs["meta"])
    return META.unpack(raw)[3] if raw is not None and len(raw) == META.size else 0.0


def apply(env: SeqEnv, txn: lmdb.Transaction, crit: PruneCriteria,
          wall_now: float | None = None) -> PrunePlan:
    """Plan inside the write transaction `txn`, then delete and fix the meta records."""
    out, doomed, prompts = plan(lmdb_prompts(env, txn), env.get_info(txn), crit, wall_now)
    delete(env, txn, doomed, prompts)
    return out


def delete(env: SeqEnv, txn: lmdb.Transaction, doomed: list[bytes], prompts: dict[str, PromptPlan]) -> None:
    """Delete the planned records and rewrite (or delete) the meta records of their prompts;
    only sound in the transaction that planned them (else appends since would be miscounted)."""
    for key in doomed:
        txn.delete(key, db=env.dbs["seqs"])
    for uid in {key_prompt(k) for k in doomed}:
        p = prompts[uid.decode()]
        if not p.keep:
            txn.delete(uid, db=env.dbs["meta"])
            continue
        nxt, _s, _t, wall, _b = env.get_meta(txn, uid)
        env.put_meta(txn, uid, (nxt, len(p.keep), sum(t for _, t, _ in p.keep), wall,
                                sum(b for *_, b in p.keep)))
