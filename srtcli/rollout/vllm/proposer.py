"""The SRT drafter as a vLLM speculative proposer (`method="custom_class"`), run in vLLM's worker.

vLLM (0.32) builds `SrtProposer(vllm_config)` inside its worker process and, after every step,
calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`:
`token_ids_cpu[i, :num_tokens_no_spec[i]]` is the prompt plus every token row i has kept so far
(this step's sampled tokens already written), and the answer is one list of draft ids per row.
Drafts carry no probabilities, so vLLM verifies them as point masses (lossless); we always draft
the most frequent path (`TokenTree.draft`), like the embedded drafter's `--draft-mode greedy`.

The hook passes no request ids, and rows move (vLLM condenses its batch when requests end), so
`TreeDrafts` recognises each row's sequence by its tokens: a row continues a sequence it tracked
if it starts with every token that sequence had; otherwise it is a new sequence, whose prompt is
found by its leading tokens (longest prompt first) in the prompt table srt wrote (`write_table`).
The cache is filled exactly as srtcli/rollout/drafters/srt.py does it: the group's tree is loaded from
LMDB when its prompt first appears, each sequence is streamed into the live tree and a delta tree
starting with the prompt's last token, up to and including eos or `max_new_tokens`; when all K
samples of a prompt are done the delta is merged into LMDB (`commit_many`, batched). A tracked
sequence that leaves the batch without eos (preempted, length-capped) is done as well.

Draft lengths follow the embedded engine's adaptive rule (grow by 2 after a fully kept draft,
shrink to kept + 1 after a rejection; past outcomes only, so verification stays exact).

The rollout driver (srtcli/rollout/vllm/engine.py) talks to the worker through vLLM's `collective_rpc`
and `SrtWorkerExtension` (mixed into the worker, so no code is pickled): `srt_reload(path)`
before a rollout reads the table file (prompts, cache path, K, limits; `$SRT_VLLM_TABLE` names
one at start-up instead), and `srt_finish` after each `generate` ends every sequence,
commits, and returns this worker's counters. With tensor parallelism every rank drafts the same
way but only rank 0 writes LMDB, so counts are not multiplied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cache_store.trie import TokenTree
# fill the cache and pick drafts exactly as the embedded drafter does
from srtcli.rollout.drafters.srt import DEPTH, SHARED_DEPTH, best_draft, bound_shared, load_tree

TABLE_ENV = "SRT_VLLM_TABLE"



@dataclass
class Table:
    """What the worker needs: the cache, the prompts srt submitted, and the draft settings."""

    cache: str | None  # None: draft from in-memory trees only
    prompts: dict[str, list[int]]  # uid -> prompt ids
    k: int  # samples per prompt (a group is done when all K are)
    max_new_tokens: int
    eos_ids: list[int]
    min_prob: float = 0.1
    adaptive: bool = True  # the embedded engine's --adaptive-budget rule (srtcli/rollout/engine/engine.py)
    shared: bool = True  # also draft from a run-wide tree (--shared-tree, srtcli/rollout/drafters/srt.py)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def write_table(path: Path, table: Table) -> None:
    """Write the table; the worker reads it from the file `$SRT_VLLM_TABLE` names."""
    path.write_text(table.to_json())


def read_table(path: str | Path) -> Table:
    return Table(**json.loads(Path(path).read_text()))


@dataclass
class _Group:
    tree: TokenTree
    delta: TokenTree
    hit: bool
    done: int = 0


@dataclass
class _Seq:
    uid: str
    plen: int
    seen: np.ndarray  # every token of the row inserted (or skipped) so far
    streams: tuple
    group: _Group  # its own reference: a retired group's sequence can still draft
    last_draft: list = field(default_factory=list)  # what we proposed for the next step
    spec_len: int = -1  # adaptive draft length (-1: not started, = budget)
    done: bool = False  # eos or max_new_tokens reached: it takes no more tokens
    ended: bool = False  # counted in its group


@dataclass
class Counters:
    steps: int = 0  # propose calls (one per engine step)
    row_forwards: int = 0  # rows that sampled tokens in a step (the embedded engine's row forwards)
    rows: int = 0  # rows that could be drafted for
    drafted_rows: int = 0  # rows given a non-empty draft
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens the row then kept (srt's own count)
    groups: int = 0
    hits: int = 0
    unknown_rows: int = 0  # rows whose prompt is not in the table (never drafted)
    commits: int = 0
    extra: dict = field(default_factory=dict)


class TreeDrafts:
    """Row tracking, tree feeding and drafting; no vLLM import (tested directly)."""

    def __init__(self, table: Table, budget: int, max_model_len: int, store: Any = None,
                 writer: bool = True, commit_every: int = 8):
        self.table, self.budget, self.max_model_len = table, budget, max_model_len
        self.store, self.writer, self.commit_every = store, writer, commit_every
        self.eos = set(table.eos_ids)
        self.by_len: dict[int, dict[tuple, str]] = {}
        for uid, ids in table.prompts.items():
            self.by_len.setdefault(len(ids), {})[tuple(ids)] = uid
        self.lengths = sorted(self.by_len, reverse=True)  # longest prompt first
        self.groups: dict[str, _Group] = {}
        self.rows: dict[int, _Seq] = {}
        self.pending: dict[str, TokenTree] = {}
        self.shared = TokenTree(max_depth=SHARED_DEPTH) if table.shared else None
        self.c = Counters()

    # --- identification -------------------------------------------------------------------
    def _identify(self, row: np.ndarray, n: int) -> str | None:
        for L in self.lengths:
            if L < n:
                uid = self.by_len[L].get(tuple(row[:L].tolist()))
                if uid is not None:
                    return uid
        return None

    def _group(self, uid: str) -> _Group:
        g = self.groups.get(uid)
        if g is None:
            tree, hit = load_tree(self.store, uid)
            g = self.groups[uid] = _Group(tree, TokenTree(max_depth=DEPTH), hit)
            self.c.groups += 1
            self.c.hits += hit
        return g

    def _new_seq(self, uid: str) -> _Seq:
        g = self._group(uid)
        plen = len(self.table.prompts[uid])
        streams = (g.tree.stream(), g.delta.stream())
        if self.shared is not None:
            streams += (self.shared.stream(),)
        anchor = [self.table.prompts[uid][-1]]
        for s in streams:
            s.extend(anchor)
        return _Seq(uid, plen, np.asarray(self.table.prompts[uid], dtype=np.int64), streams, g)

    @staticmethod
    def _continues(s: _Seq, row: np.ndarray, n: int) -> bool:
        m = len(s.seen)
        return not s.ended and n >= m and np.array_equal(row[:m], s.seen)

    def _moved(self, free: dict[int, _Seq], row: np.ndarray, n: int) -> _Seq | None:
        """A tracked sequence that now sits in another row (vLLM condensed its batch)."""
        return next((s for s in free.values() if self._continues(s, row, n)), None)

    # --- the hook -----------------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        self.c.steps += 1
        nrows = len(sampled_token_ids)
        self.c.row_forwards += sum(1 for t in sampled_token_ids if len(t))
        prev, cur = self.rows, {}
        free = {id(s): s for s in prev.values()}
        for i in range(nrows):  # rows that kept their sequence
            s = prev.get(i)
            if s is not None and self._continues(s, token_ids_cpu[i], int(num_tokens_no_spec[i])):
                cur[i] = s
                free.pop(id(s), None)
        for i in range(nrows):  # moved rows, then new sequences
            if i in cur:
                continue
            n = int(num_tokens_no_spec[i])
            if not len(sampled_token_ids[i]):
                continue  # still prefilling: nothing sampled yet
            row = token_ids_cpu[i]
            s = self._moved(free, row, n)
            if s is not None:
                free.pop(id(s))
            else:
                uid = self._identify(row, n)
                if uid is None:
                    self.c.unknown_rows += 1
                    continue
                s = self._new_seq(uid)
            cur[i] = s
        for s in free.values():  # left the batch: finished
            self._end(s)
        self.rows = cur
        out: list[list[int]] = [[] for _ in range(nrows)]
        for i, s in cur.items():
            n = int(num_tokens_no_spec[i])
            self._feed(s, token_ids_cpu[i], n)
            if len(sampled_token_ids[i]) and not s.done:
                out[i] = s.last_draft = self._draft(s, token_ids_cpu[i], n)
        if self.pending and len(self.pending) >= self.commit_every:
            self.flush()
        return out

    def _feed(self, s: _Seq, row: np.ndarray, n: int) -> None:
        m = len(s.seen)
        if n <= m or s.done:
            return
        new = row[m:n].tolist()
        if s.last_draft:  # kept drafts come first; the next token is vLLM's correction or bonus
            a = 0
            while a < min(len(new), len(s.last_draft)) and new[a] == s.last_draft[a]:
                a += 1
            self.c.accepted_tokens += a
            if self.table.adaptive:  # past outcomes only: verification stays exact
                d = len(s.last_draft)
                s.spec_len = min(self.budget, s.spec_len + 2) if a == d else max(1, a + 1)
            s.last_draft = []
        left = self.table.max_new_tokens - (m - s.plen)
        keep = new[:max(left, 0)]
        for j, t in enumerate(keep):
            if t in self.eos:
                keep = keep[: j + 1]
                break
        for st in s.streams:
            st.extend(keep)
        s.seen = np.concatenate([s.seen, np.asarray(new, dtype=np.int64)])
        capped = m - s.plen + len(keep) >= self.table.max_new_tokens
        if len(keep) < len(new) or (keep and keep[-1] in self.eos) or capped:
            s.done = True

    def _draft(self, s: _Seq, row: np.ndarray, n: int) -> list[int]:
        self.c.rows += 1
        if s.spec_len < 0:
            s.spec_len = self.budget
        room = min(s.spec_len, self.max_model_len - n - 1, self.table.max_new_tokens - (n - s.plen) - 1)
        if room <= 0:
            return []
        ctx = [int(row[s.plen - 1])] + row[s.plen:n][-(DEPTH - 1):].tolist()
        toks = best_draft(s.group.tree, self.shared, ctx, room, self.table.min_prob)[1].tokens
        if toks:
            self.c.drafted_rows += 1
            self.c.drafted_tokens += len(toks)
        return list(toks)

    # --- ending -------------------------------------------------------------------------------
    def _end(self, s: _Seq) -> None:
        if s.ended:
            return
        s.ended = True
        s.group.done += 1
        if s.group.done >= self.table.k and self.groups.get(s.uid) is s.group:
            self._retire(s.uid)

    def _retire(self, uid: str) -> None:
        bound_shared(self.shared)
        g = self.groups.pop(uid)
        if g.delta.mass > 0:
            self.pending[uid] = g.delta

    def flush(self) -> None:
        """Merge pending deltas into LMDB in one transaction (rank 0 only)."""
        if self.store is not None and self.writer and self.pending:
            self.store.commit_many(self.pending)
            self.c.commits += 1
        self.pending = {}

    def finish(self) -> dict[str, int]:
        """End every tracked sequence and group, commit, return and reset the counters."""
        for s in self.rows.values():
            self._end(s)
        self.rows = {}
        for uid in list(self.groups):
            self._retire(uid)
        self.flush()
        out = {k: v for k, v in self.c.__dict__.items() if k != "extra"}
        self.c = Counters()
        return out


class SrtProposer:
    """vLLM's custom proposer: `speculative_config={"method": "custom_class",
    "model": "srtcli.rollout.vllm.proposer.SrtProposer", "num_speculative_tokens": B}`."""

    def __init__(self, vllm_config: Any):
        self.budget = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.drafts = TreeDrafts(Table(None, {}, 1, 1, []), self.budget, self.max_model_len)
        if os.environ.get(TABLE_ENV):
            self.reload(os.environ[TABLE_ENV])

    def reload(self, path: str) -> None:
        """Start a rollout: read its table (prompts, cache); pending work is committed first."""
        self.drafts.finish()
        if self.drafts.store is not None:
            self.drafts.store.close()
        table = read_table(path)
        store = None
        if table.cache is not None:
            from cache_store.store import CacheStore

            store = CacheStore.open(Path(table.cache))
        self.drafts = TreeDrafts(table, self.budget, self.max_model_len, store, writer=_is_rank0())

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The CPU runner calls this on drafters; a tree needs no model."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        return self.drafts.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)


def _is_rank0() -> bool:
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return get_tp_group().rank_in_group == 0 and get_pp_group().rank_in_group == 0
    except Exception:  # not initialised (a single process): this is the only writer
        return True


class SrtWorkerExtension:
    """Mixed into vLLM's worker (`LLM(worker_extension_cls=...)`), so the driver can call
    `llm.collective_rpc("srt_finish")` without pickling code into the worker."""

    def _srt(self) -> "SrtProposer | None":
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        return drafter if isinstance(drafter, SrtProposer) else None

    def srt_reload(self, path: str) -> bool:
        p = self._srt()
        if p is not None:
            p.reload(path)
        return p is not None

    def srt_finish(self) -> dict[str, int]:
        p = self._srt()
        return p.drafts.finish() if p is not None else {}
