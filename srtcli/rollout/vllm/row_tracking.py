"""Which sequence each row of vLLM's batch holds, step after step, for the SRT proposer
(`tree_drafts.TreeDrafts` mixes this in; no vLLM import, so it is tested directly).

The hook passes no request ids, and rows move (vLLM condenses its batch), so each row's
sequence is recognised by its tokens, reading only what a step changed: a row continues a
sequence it tracked if it holds exactly what the sequence had plus this step's sampled tokens
(a done one: at least what it had) and the same `TAIL` tokens before that length (one gather
for the whole batch); otherwise it is a sequence that moved there, one that left the batch and
came back (vLLM drops a request it preempts or skips for a step; it returns holding exactly
what it held plus this step's tokens), or a new one, whose prompt is what its row held before
its first sampled tokens. A sequence out of the batch may come back for `PARK_STEPS` steps;
then it ends.

The host class supplies `rows` (slot -> sequence), `away`, `step`, the counters `c`, and
`_new_seq(row, prompt_len)` / `_end(seq)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from srtcli.rollout.drafters.group_trees import DEPTH, Group

# tokens before a row's known length that recognise it (with the length) next step: as many as a
# draft reads, so only rows that end alike as far as a draft looks can be taken for each other
TAIL = DEPTH
PARK_STEPS = 256  # steps a sequence out of the batch may still come back as itself


@dataclass
class TrackedSeq:
    """One sequence the proposer tracks: its prompt group, what it has fed, and its drafting state."""

    uid: str
    plen: int
    seen: int  # tokens of the row inserted (or skipped) so far: the row's length last step
    streams: tuple  # the group tree's stream first, then the run-wide tree's
    cores: tuple  # their compiled streams, for the batched calls
    group: Group  # its own reference: a sequence of a group no longer in memory can still draft
    tail: Any = None  # the row's last `TAIL` tokens before `seen` (what recognises the row)
    last_draft: list = field(default_factory=list)  # what we proposed for the next step
    spec_len: int = -1  # adaptive draft length (-1: not started, = budget)
    done: bool = False  # eos or max_new_tokens reached: it takes no more tokens
    ended: bool = False  # committed (or waiting to be)
    left: int = -1  # the step it left the batch at, while it may come back


def tail_positions(seen: np.ndarray, slots: Any = 0, width: int = 0) -> np.ndarray:
    """Per row, the `TAIL` positions just before its `seen` (clipped at 0), to gather at once; as
    flat indices of the rows' `slots` in a batch `width` tokens wide (one 1-d gather costs a
    quarter of a 2-d one; `ids.reshape(-1)` is a view of vLLM's C-contiguous `token_ids_cpu`)."""
    return np.maximum(seen[:, None] - TAIL + np.arange(TAIL), 0) + np.reshape(slots * width, (-1, 1))


class RowTracking:
    """Recognising each row's sequence from one step to the next (see the module docstring)."""

    @staticmethod
    def _continues(s: TrackedSeq, row: np.ndarray, n: int, k: int) -> bool:
        """Whether a row `n` long that sampled `k` tokens holds `s`: exactly what it had and those (a
        longer identical sibling, as greedy samples are, is not it), with the same tail."""
        held = n >= s.seen if s.done else n - k == s.seen  # a done one may hold junk after eos
        return held and np.array_equal(row[tail_positions(np.array([s.seen]))[0]], s.tail)

    def _moved(self, free: dict[int, TrackedSeq], row: np.ndarray, n: int, k: int) -> TrackedSeq | None:
        """A tracked sequence that now sits in another row (vLLM condensed its batch)."""
        return next((s for s in free.values() if self._continues(s, row, n, k)), None)

    def _returned(self, row: np.ndarray, held: int) -> TrackedSeq | None:
        """A sequence back in the batch holding exactly what it held (a longer row starting with it is new)."""
        return next((s for s in self.away.values() if s.seen == held and self._continues(s, row, held, 0)), None)

    def _arrived(self, free: dict[int, TrackedSeq], row: np.ndarray, n: int, k: int) -> TrackedSeq:
        """The sequence a row holds that is not the one it held: a tracked one that moved, one
        that came back, else a new one whose prompt is the row without its `k` sampled tokens."""
        s = self._moved(free, row, n, k)
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

    def _kept(self, sampled: np.ndarray, num: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Per tracked sequence (order of `rows`): whether its row still holds it (`_continues`), at once."""
        same = np.zeros(len(self.slots), dtype=bool)
        live = self.slots < len(sampled)
        if live.any():
            slots, seen = self.slots[live], self.seen[live]
            at = self.tail_at[live] if ids.shape[1] == self.width else tail_positions(seen, slots, ids.shape[1])
            grown = np.where(self.done[live], num[slots] >= seen, num[slots] - sampled[slots] == seen)
            same[live] = (ids.reshape(-1)[at] == self.tails[live]).all(1) & grown
        return same

    def _track(self, sampled: np.ndarray, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray) -> dict[int, TrackedSeq]:
        """Row -> the sequence it holds now (`sampled`: how many tokens each row sampled this
        step); a tracked sequence no row holds any more has left."""
        kept, prev = self._kept(sampled, num_tokens_no_spec, token_ids_cpu), list(self.rows.values())
        cur = {i: self.rows[i] for i in np.sort(self.slots[kept]).tolist()}  # rows that kept their sequence
        free = {}
        for j in np.flatnonzero(~kept).tolist():  # the others may have moved, left or come back later
            s = prev[j]
            s.tail = self.tails[j]
            free[id(s)] = s
        for i, k in enumerate(sampled.tolist()):  # moved rows, returning and new sequences
            if i in cur or not k:  # still prefilling: nothing sampled yet
                continue
            cur[i] = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]), k)
        for s in free.values():
            self._left(s)
        return cur

    def _left(self, s: TrackedSeq) -> None:
        """A sequence left the batch (finished, preempted or skipped: it may come back); ends in `PARK_STEPS`."""
        if not s.ended:
            s.left = self.step
            self.away[id(s)] = s

    def _expire(self) -> None:
        # `away` is in leaving order (a returning one is re-inserted when it leaves again): expired ones first
        while self.away and self.step - (s := next(iter(self.away.values()))).left > PARK_STEPS:
            del self.away[id(s)]
            self._end(s)

    def _remember(self, slots: np.ndarray, seen: np.ndarray, done: np.ndarray, ids: np.ndarray) -> None:
        """Each tracked row's slot, length, doneness and `TAIL` tokens before it, for the next step."""
        self.slots, self.seen, self.done, self.width = slots, seen, done, ids.shape[1]
        self.tail_at = tail_positions(seen, slots, self.width)
        self.tails = ids.reshape(-1)[self.tail_at]

