"""Row tracking, tree feeding and drafting for the SRT proposer in vLLM's worker (no vLLM import,
so it is tested directly).

After every step vLLM hands over `token_ids_cpu[i, :num_tokens_no_spec[i]]`, the prompt plus
every token row i has kept so far (this step's sampled tokens already written), and wants one
list of draft ids per row. Drafts carry no probabilities, so vLLM verifies them as point masses
(lossless); we always draft the most frequent path (`SuffixTree.draft`), like the embedded
drafter's `--draft-mode greedy`.

The hook passes no request ids, and rows move (vLLM condenses its batch when requests end), so
each row's sequence is recognised by its tokens: a row continues a sequence it tracked if it
starts with every token that sequence had; otherwise it is a new sequence, whose prompt is
found by its leading tokens (longest prompt first) in the prompt table. The trees are the
embedded drafter's (`srtcli.rollout.drafters.group_trees.GroupTrees`): each sequence is
streamed into them up to and including eos or `max_new_tokens`; when all K samples of a prompt
are done its new sequences are appended to the store (batched). A tracked sequence that leaves the batch without
eos (preempted, length-capped) is done as well. Draft lengths follow the embedded engine's
adaptive rule (`srtcli.rollout.drafters.draft_length`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from srtcli.rollout.drafters.draft_length import next_draft_length
from srtcli.rollout.drafters.group_trees import DEPTH, Group, GroupTrees
# pick drafts exactly as the embedded drafter does
from srtcli.rollout.drafters.srt import best_draft
from srtcli.rollout.vllm.table import Table


@dataclass
class _Seq:
    uid: str
    plen: int
    seen: np.ndarray  # every token of the row inserted (or skipped) so far
    streams: tuple
    group: Group  # its own reference: a retired group's sequence can still draft
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
    groups: int = 0  # groups loaded (filled in from the trees by `finish`)
    hits: int = 0
    unknown_rows: int = 0  # rows whose prompt is not in the table (never drafted)
    commits: int = 0
    extra: dict = field(default_factory=dict)


class TreeDrafts:
    """The proposer's state over one rollout: the prompt table, the tracked rows, the trees."""

    def __init__(self, table: Table, budget: int, max_model_len: int, store: Any = None,
                 writer: bool = True, commit_every: int = 8):
        self.table, self.budget, self.max_model_len = table, budget, max_model_len
        self.eos = set(table.eos_ids)
        self.by_len: dict[int, dict[tuple, str]] = {}
        for uid, ids in table.prompts.items():
            self.by_len.setdefault(len(ids), {})[tuple(ids)] = uid
        self.lengths = sorted(self.by_len, reverse=True)  # longest prompt first
        self.trees = GroupTrees(store, table.shared, commit_every, writer)
        self.rows: dict[int, _Seq] = {}
        self.c = Counters()

    # --- identification -------------------------------------------------------------------
    def _identify(self, row: np.ndarray, n: int) -> str | None:
        for L in self.lengths:
            if L < n:
                uid = self.by_len[L].get(tuple(row[:L].tolist()))
                if uid is not None:
                    return uid
        return None

    def _new_seq(self, uid: str) -> _Seq:
        g = self.trees.group(uid)
        self.trees.count(g)
        prompt = self.table.prompts[uid]
        return _Seq(uid, len(prompt), np.asarray(prompt, dtype=np.int64), self.trees.streams(g, prompt[-1]), g)

    @staticmethod
    def _continues(s: _Seq, row: np.ndarray, n: int) -> bool:
        m = len(s.seen)
        return not s.ended and n >= m and np.array_equal(row[:m], s.seen)

    def _moved(self, free: dict[int, _Seq], row: np.ndarray, n: int) -> _Seq | None:
        """A tracked sequence that now sits in another row (vLLM condensed its batch)."""
        return next((s for s in free.values() if self._continues(s, row, n)), None)

    def _arrived(self, free: dict[int, _Seq], row: np.ndarray, n: int) -> _Seq | None:
        """The sequence a row holds that is not the one it held: a tracked one that moved, else
        a new one; None if its prompt is unknown."""
        s = self._moved(free, row, n)
        if s is not None:
            free.pop(id(s))
            return s
        uid = self._identify(row, n)
        if uid is None:
            self.c.unknown_rows += 1
            return None
        return self._new_seq(uid)

    def _track(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
               token_ids_cpu: np.ndarray) -> dict[int, _Seq]:
        """Row -> the sequence it holds now; a tracked sequence no row holds any more is ended."""
        prev, cur = self.rows, {}
        free = {id(s): s for s in prev.values()}
        for i in range(len(sampled_token_ids)):  # rows that kept their sequence
            s = prev.get(i)
            if s is not None and self._continues(s, token_ids_cpu[i], int(num_tokens_no_spec[i])):
                cur[i] = s
                free.pop(id(s), None)
        for i in range(len(sampled_token_ids)):  # moved rows, then new sequences
            if i in cur or not len(sampled_token_ids[i]):  # still prefilling: nothing sampled yet
                continue
            s = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]))
            if s is not None:
                cur[i] = s
        for s in free.values():  # left the batch: finished
            self._end(s)
        return cur

    # --- the hook -----------------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Feed every row's new tokens to its trees; one list of draft ids per row."""
        self.c.steps += 1
        self.c.row_forwards += sum(1 for t in sampled_token_ids if len(t))
        self.rows = self._track(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        out: list[list[int]] = [[] for _ in range(len(sampled_token_ids))]
        for i, s in self.rows.items():
            n = int(num_tokens_no_spec[i])
            self._feed(s, token_ids_cpu[i], n)
            if len(sampled_token_ids[i]) and not s.done:
                out[i] = s.last_draft = self._draft(s, token_ids_cpu[i], n)
        if self.trees.flush_if_due():
            self.c.commits += 1
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
            if self.table.adaptive:
                s.spec_len = next_draft_length(s.spec_len, self.budget, len(s.last_draft), a)
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
        toks = best_draft(s.group.tree, self.trees.shared, ctx, room, self.table.min_prob)[1].tokens
        if toks:
            self.c.drafted_rows += 1
            self.c.drafted_tokens += len(toks)
        return list(toks)

    # --- ending -------------------------------------------------------------------------------
    def _end(self, s: _Seq) -> None:
        if s.ended:
            return
        s.ended = True
        s.group.finished += 1
        if s.group.finished >= self.table.k and self.trees.groups.get(s.uid) is s.group:
            self.trees.retire(s.uid)

    def flush(self) -> None:
        """Append the finished groups' new sequences in one transaction (the writer rank only)."""
        if self.trees.flush():
            self.c.commits += 1

    def finish(self) -> dict[str, int]:
        """End every tracked sequence and group, append, return and reset the counters."""
        for s in self.rows.values():
            self._end(s)
        self.rows = {}
        for uid in list(self.trees.groups):
            self.trees.retire(uid)
        self.flush()
        self.c.groups, self.c.hits = self.trees.loaded, self.trees.hits
        self.trees.loaded = self.trees.hits = 0
        out = {k: v for k, v in self.c.__dict__.items() if k != "extra"}
        self.c = Counters()
        return out
