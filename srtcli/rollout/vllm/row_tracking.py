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

A step's row state is a few arrays in row order (here `slots`, `seen`, `done`, `tails`; the
drafting state in the host), carried to the next step by index (`_track`'s `src`), so a step
touches no Python object per row that kept its sequence.

The host class supplies `rows` (slot -> sequence), `away`, `step`, the counters `c`, and
`_new_seq(row, prompt_len)` / `_end(seq)`; it may extend `_park`.
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
    """One sequence the proposer tracks: its prompt group, what it has fed, and its drafting
    state. While a row holds it, that state (`seen` to `done`) lives in the proposer's arrays, a
    column per row, and these fields are stale; they hold it again from the step its row loses
    it (`_park`) until a row takes it up again."""

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


def gather_tails(ids: np.ndarray, slots: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Per row, the `TAIL` tokens of `ids[slot]` just before its `seen` (positions clipped at 0),
    gathered at once. Rows at least `TAIL` long (a production batch: prompts alone are longer)
    take whole windows of the flat buffer, a fifth of the cost of gathering token by token
    (`ids.reshape(-1)` is a view of vLLM's C-contiguous `token_ids_cpu`)."""
    flat, width = np.ascontiguousarray(ids).reshape(-1), ids.shape[1]
    if len(seen) and int(seen.min()) >= TAIL:
        windows = np.ndarray((len(flat) - TAIL + 1, TAIL), flat.dtype, flat, 0, flat.strides * 2)  # a view
        windows.flags.writeable = False  # (np.ndarray, not as_strided: a fifth of its 5 us)
        return windows[slots * width + seen - TAIL]
    return flat[np.maximum(seen[:, None] - TAIL + np.arange(TAIL), 0) + np.reshape(slots * width, (-1, 1))]


def grown(seen: Any, done: Any, n: Any, k: Any) -> Any:
    """Whether a row `n` long that sampled `k` tokens is as long as a sequence `seen` long would
    be now: exactly what it had and those (a longer identical sibling, as greedy samples are, is
    not it); a done one at least what it had (it may hold junk after eos). Scalars or arrays."""
    return np.where(done, n >= seen, n - k == seen)


class RowTracking:
    """Recognising each row's sequence from one step to the next (see the module docstring)."""

    @staticmethod
    def _continues(s: TrackedSeq, row: np.ndarray, n: int, k: int) -> bool:
        """Whether a row `n` long that sampled `k` tokens holds `s`: `grown` to its length, with the same tail."""
        tail = gather_tails(row[None], np.zeros(1, np.int64), np.array([s.seen]))[0]
        return bool(grown(s.seen, s.done, n, k)) and np.array_equal(tail, s.tail)

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
            same[live] = grown(seen, self.done[live], num[slots], sampled[slots]) \
                & (gather_tails(ids, slots, seen) == self.tails[live]).all(1)
        return same

    def _track(self, sampled: np.ndarray, num_tokens_no_spec: np.ndarray,
               token_ids_cpu: np.ndarray) -> tuple[dict[int, TrackedSeq], np.ndarray]:
        """Row -> the sequence it holds now (`sampled`: how many tokens each row sampled this
        step), and per row (in that order) where its state was last step: its index in the
        arrays `_remember` kept, or -1 (it moved, came back or is new: its `TrackedSeq` holds
        it). A tracked sequence no row holds any more has left."""
        kept, prev = self._kept(sampled, num_tokens_no_spec, token_ids_cpu), list(self.rows.values())
        src = np.flatnonzero(kept)
        src = src[np.argsort(self.slots[src], kind="stable")]  # rows that kept their sequence, by row
        cur = dict(zip(self.slots[src].tolist(), map(prev.__getitem__, src.tolist())))
        free = {}
        for j in np.flatnonzero(~kept).tolist():  # the others may have moved, left or come back later
            s = prev[j]
            self._park(s, j)
            free[id(s)] = s
        held = np.zeros(len(sampled), dtype=bool)
        held[self.slots[src]] = True
        arrived = np.flatnonzero((sampled > 0) & ~held).tolist()  # rows still prefilling sampled nothing
        for i in arrived:  # moved rows, returning and new sequences
            cur[i] = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]), int(sampled[i]))
        for s in free.values():
            self._left(s)
        return cur, np.concatenate([src, np.full(len(arrived), -1, dtype=np.int64)])

    def _park(self, s: TrackedSeq, j: int) -> None:
        """Sequence `j` of the kept arrays leaves them: its state goes back into its `TrackedSeq`."""
        s.seen, s.done, s.tail = int(self.seen[j]), bool(self.done[j]), self.tails[j]

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
        self.slots, self.seen, self.done = slots, seen, done
        self.tails = gather_tails(ids, slots, seen)
