"""Row tracking, tree feeding and drafting for the SRT proposer in vLLM's worker (no vLLM import,
so it is tested directly).

After every step vLLM hands over `token_ids_cpu[i, :num_tokens_no_spec[i]]`, the prompt plus
every token row i has kept so far (this step's sampled tokens already written), and wants one
list of draft ids per row. Drafts carry no probabilities, so vLLM verifies them as point masses
(lossless); we draft the most frequent path (`SuffixTree.draft`), as `--draft-mode greedy` does.

The hook passes no request ids, and rows move (vLLM condenses its batch), so each row's
sequence is recognised by its tokens, reading only what a step changed: a row continues a
sequence it tracked if it is at least as long as the sequence was and holds the same `TAIL`
tokens before that length (one gather for the whole batch); otherwise it is a sequence that
moved there, one that left the batch and came back (vLLM drops a request it preempts or skips
for a step; it returns holding exactly what it held plus this step's tokens), or a new one. A
new sequence's prompt is what its row held before its first sampled tokens; its group
(`commits.LiveGroups` over the embedded drafter's `GroupTrees`) is that prompt's `prompt_uid`
under the tokenizer's fingerprint, so rows with the same prompt share one tree. A sequence is
streamed into the trees up to and including eos or `max_new_tokens` and ends there, or after
`PARK_STEPS` steps out of the batch; then it is committed (batched). Draft lengths follow the
embedded engine's adaptive rule (`srtcli.rollout.drafters.draft_length`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from cache_store.uid import prompt_uid
from srtcli.rollout.drafters.draft_length import next_draft_length
from srtcli.rollout.drafters.group_trees import DEPTH, Group, GroupTrees
# pick drafts exactly as the embedded drafter does
from srtcli.rollout.drafters.srt import best_draft
from srtcli.rollout.vllm.commits import COMMIT_EVERY, COMMIT_SECONDS, IDLE_GROUPS, LiveGroups, StepClock
from srtcli.rollout.vllm.counters import Counters
from srtcli.rollout.vllm.table import Table

# tokens before a row's known length that recognise it (with the length) next step: as many as a
# draft reads, so only rows that end alike as far as a draft looks can be taken for each other
TAIL = DEPTH
PARK_STEPS = 256  # steps a sequence out of the batch may still come back as itself


@dataclass
class _Seq:
    uid: str
    plen: int
    seen: int  # tokens of the row inserted (or skipped) so far: the row's length last step
    streams: tuple  # the group tree's stream first: it drafts without looking the context up
    group: Group  # its own reference: a sequence of a group no longer in memory can still draft
    tail: Any = None  # the row's last `TAIL` tokens before `seen` (what recognises the row)
    last_draft: list = field(default_factory=list)  # what we proposed for the next step
    spec_len: int = -1  # adaptive draft length (-1: not started, = budget)
    done: bool = False  # eos or max_new_tokens reached: it takes no more tokens
    ended: bool = False  # committed (or waiting to be)
    left: int = -1  # the step it left the batch at, while it may come back


def tail_positions(seen: np.ndarray) -> np.ndarray:
    """Per row, the `TAIL` positions just before its `seen` (clipped at 0), to gather at once."""
    return np.maximum(seen[:, None] - TAIL + np.arange(TAIL), 0)


class TreeDrafts:
    """The proposer's state: its settings, the tracked rows, the trees and their commits.
    `table.fingerprint` must be set (`worker_facts.completed`). Thread-safe: vLLM's step and the
    proposer's idle-commit thread both come through the lock."""

    def __init__(self, table: Table, budget: int, max_model_len: int, store: Any = None, writer: bool = True,
                 commit_every: int = COMMIT_EVERY, commit_seconds: float = COMMIT_SECONDS,
                 idle_groups: int = IDLE_GROUPS):
        if not table.fingerprint or table.adaptive is None:
            raise ValueError("TreeDrafts needs a completed table: fingerprint and adaptive set (worker_facts)")
        self.table, self.budget, self.max_model_len = table, budget, max_model_len
        self.cap = table.max_new_tokens if table.max_new_tokens is not None else max_model_len
        self.eos = set(table.eos_ids or ())
        self.trees = GroupTrees(store, table.shared, writer=writer)
        self.groups = LiveGroups(self.trees, commit_every, commit_seconds, idle_groups)
        self.rows: dict[int, _Seq] = {}
        self.tails = np.zeros((0, TAIL), dtype=np.int64)  # each row's `_Seq.tail`, in one array
        self.away: dict[int, _Seq] = {}  # id -> sequence out of the batch that may come back
        self.step, self.clock = 0, StepClock()
        self.lock = threading.RLock()
        self.c = Counters()

    # --- identification -------------------------------------------------------------------
    def _new_seq(self, row: np.ndarray, plen: int) -> _Seq:
        prompt = row[:plen].tolist()
        uid = prompt_uid(prompt, self.table.fingerprint)
        g = self.groups.open(uid)
        return _Seq(uid, plen, plen, self.trees.streams(g, prompt[-1]), g)

    @staticmethod
    def _continues(s: _Seq, row: np.ndarray, n: int) -> bool:
        return n >= s.seen and np.array_equal(row[tail_positions(np.array([s.seen]))[0]], s.tail)

    def _moved(self, free: dict[int, _Seq], row: np.ndarray, n: int) -> _Seq | None:
        """A tracked sequence that now sits in another row (vLLM condensed its batch)."""
        return next((s for s in free.values() if self._continues(s, row, n)), None)

    def _returned(self, row: np.ndarray, held: int) -> _Seq | None:
        """A sequence out of the batch that came back holding exactly what it held (and this
        step's tokens): a longer row that merely starts with it, like a chat's next turn, is new."""
        return next((s for s in self.away.values() if s.seen == held and self._continues(s, row, held)), None)

    def _arrived(self, free: dict[int, _Seq], row: np.ndarray, n: int, k: int) -> _Seq:
        """The sequence a row holds that is not the one it held: a tracked one that moved, one
        that came back, else a new one whose prompt is the row without its `k` sampled tokens."""
        s = self._moved(free, row, n)
        if s is not None:
            free.pop(id(s))
            return s
        s = self._returned(row, n - k)
        if s is not None:
            del self.away[id(s)]
            s.left = -1
            self.c.resumed_rows += 1
            return s
        return self._new_seq(row, max(n - k, 1))

    def _kept(self, rows: int, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray) -> list[int]:
        """The rows (< `rows`) still holding last step's sequence: as long as they were or longer,
        with the same `TAIL` tokens before that length; one gather for the whole batch."""
        slots = np.fromiter(self.rows, np.int64, len(self.rows))
        live = slots < rows
        if not live.any():
            return []
        slots, tails = slots[live], self.tails[live]
        seen = np.fromiter((s.seen for s in self.rows.values()), np.int64, len(self.rows))[live]
        same = (token_ids_cpu[slots[:, None], tail_positions(seen)] == tails).all(1)
        # in row order: rows are fed (and see each other's tokens) in the order vLLM keeps them
        return np.sort(slots[same & (np.asarray(num_tokens_no_spec)[slots] >= seen)]).tolist()

    def _track(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
               token_ids_cpu: np.ndarray) -> dict[int, _Seq]:
        """Row -> the sequence it holds now; a tracked sequence no row holds any more has left."""
        prev, cur = self.rows, {}
        free = {id(s): s for s in prev.values()}
        for i in self._kept(len(sampled_token_ids), num_tokens_no_spec, token_ids_cpu):
            cur[i] = prev[i]  # rows that kept their sequence
            free.pop(id(prev[i]), None)
        for i in range(len(sampled_token_ids)):  # moved rows, returning and new sequences
            if i in cur or not len(sampled_token_ids[i]):  # still prefilling: nothing sampled yet
                continue
            k = len(sampled_token_ids[i])
            cur[i] = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]), k)
        for s in free.values():
            self._left(s)
        return cur

    def _left(self, s: _Seq) -> None:
        """A sequence left the batch: finished, or preempted or skipped for a step (it may come
        back); it ends after `PARK_STEPS` steps away."""
        if not s.ended:
            s.left = self.step
            self.away[id(s)] = s

    def _expire(self) -> None:
        for s in [s for s in self.away.values() if self.step - s.left > PARK_STEPS]:
            del self.away[id(s)]
            self._end(s)

    def _remember(self, token_ids_cpu: np.ndarray) -> None:
        """Note each tracked row's length and the tokens before it, for the next step."""
        slots = np.fromiter(self.rows, np.int64, len(self.rows))
        seen = np.fromiter((s.seen for s in self.rows.values()), np.int64, len(self.rows))
        self.tails = token_ids_cpu[slots[:, None], tail_positions(seen)]  # in the order of `rows`
        for s, t in zip(self.rows.values(), self.tails):
            s.tail = t

    # --- the hook -----------------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Feed every row's new tokens to its trees; one list of draft ids per row."""
        with self.lock:
            self.clock.tick()
            self.step += 1
            self.c.steps += 1
            self.c.row_forwards += sum(1 for t in sampled_token_ids if len(t))
            self.rows = self._track(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            out: list[list[int]] = [[] for _ in range(len(sampled_token_ids))]
            nums = np.asarray(num_tokens_no_spec)[:len(out)].tolist()
            for i, s in self.rows.items():
                row, n = token_ids_cpu[i], nums[i]
                self._feed(s, row, n)
                if len(sampled_token_ids[i]) and not s.done:
                    out[i] = s.last_draft = self._draft(s, row, n)
            self._remember(token_ids_cpu)
            self._expire()
            if self.groups.due():
                self.flush()
            self.clock.tick()
            return out

    def _feed(self, s: _Seq, row: np.ndarray, n: int) -> None:
        if n <= s.seen or s.done:
            return
        new = row[s.seen:n].tolist()
        if s.last_draft:
            self._verified(s, new)
        self._take(s, new)
        s.seen = n

    def _verified(self, s: _Seq, new: list[int]) -> None:
        """Count the kept drafts (they come first; the next token is vLLM's correction or bonus)
        and adapt the draft length."""
        a = 0
        for t, d in zip(new, s.last_draft):
            if t != d:
                break
            a += 1
        self.c.accepted_tokens += a
        if self.table.adaptive:
            s.spec_len = next_draft_length(s.spec_len, self.budget, len(s.last_draft), a)
        s.last_draft = []

    def _take(self, s: _Seq, new: list[int]) -> None:
        """Stream the row's new tokens up to and including eos or `max_new_tokens`; the
        sequence ends there (vLLM may hold accepted drafts past either in the row)."""
        left = self.cap - (s.seen - s.plen)
        keep = new if left >= len(new) else new[:max(left, 0)]
        if not self.eos.isdisjoint(keep):
            keep = keep[: next(j for j, t in enumerate(keep) if t in self.eos) + 1]
        for st in s.streams:
            st.extend(keep)
        capped = s.seen - s.plen + len(keep) >= self.cap
        if len(keep) < len(new) or (keep and keep[-1] in self.eos) or capped:
            s.done = True
            self._end(s)

    def _room(self, s: _Seq, n: int) -> int:
        if s.spec_len < 0:
            s.spec_len = self.budget
        return min(s.spec_len, self.max_model_len - n - 1, self.cap - (n - s.plen) - 1)

    def _draft(self, s: _Seq, row: np.ndarray, n: int) -> list[int]:
        """The most frequent path after the row's last tokens: the group tree's stream holds
        exactly the row's output (anchor first) while it drafts, so it drafts without a lookup."""
        self.c.rows += 1
        room = self._room(s, n)
        if room <= 0:
            return []
        best = best_draft(s.streams, room, self.table.min_prob)[1]
        if best.tokens:
            self.c.drafted_rows += 1
            self.c.drafted_tokens += len(best.tokens)
        return best.tokens

    # --- ending -------------------------------------------------------------------------------
    def _end(self, s: _Seq) -> None:
        if not s.ended:
            s.ended = True
            self.groups.close(s.uid, s.group, s.streams[0].sequence_id)

    def flush(self) -> None:
        """Append the ended sequences in one transaction (the writer rank only)."""
        with self.lock:
            if self.groups.flush():
                self.c.commits += 1

    def commit_if_idle(self, seconds: float | None = None) -> None:
        """When vLLM is idle (`StepClock.idle`, `seconds` default commit_seconds) nothing runs:
        every sequence has ended, whether its row has been seen to leave or not. End them all and
        append. (A row that does step again drafts on; only its stored copy stops here.)"""
        with self.lock:
            idle = self.clock.idle(self.groups.commit_seconds if seconds is None else seconds)
            if idle and (self.rows or self.away or self.groups.waiting):
                for s in self.rows.values():
                    self._end(s)
                self._end_all(self.away)
                self.flush()

    def _end_all(self, seqs: dict) -> None:
        for s in list(seqs.values()):
            self._end(s)
        seqs.clear()

    def finish(self) -> dict[str, int]:
        """End every sequence, append, return and reset the counters (the groups stay in
        memory; a row after this is a new sequence)."""
        with self.lock:
            self._end_all(self.rows)
            self._end_all(self.away)
            self.tails = self.tails[:0]
            self.flush()
            self.c.groups, self.c.hits = self.trees.loaded, self.trees.hits
            self.trees.loaded = self.trees.hits = 0
            out = dict(self.c.__dict__)
            self.c = Counters()
            return out
