"""How the SRT proposer recognises which sequence each row of vLLM's batch holds, step after
step: `RowTracker`, the sequences it tracks (`TrackedSeq`) and the vectorised tests it applies to
a whole batch (no vLLM import, so they are tested directly). `tree_drafts.TreeDrafts` feeds and
drafts the rows the tracker gives it.

The hook passes no request ids, and rows move (vLLM condenses its batch), so each row's
sequence is recognised by its tokens, reading only what a step changed: a row continues a
sequence it tracked if it holds exactly what the sequence had plus this step's sampled tokens
(a done one: at least what it had) and the same `TAIL` tokens before that length (one gather
for the whole batch); otherwise it is a sequence that moved there, one that left the batch and
came back (vLLM drops a request it preempts or skips for a step; it returns holding exactly
what it held plus this step's tokens), or a new one, whose prompt is what its row held before
its first sampled tokens. A sequence out of the batch may come back for `PARK_STEPS` steps;
then it ends.

A driver that runs tools (`srt rollout --engine vllm --tools`) sends each model turn of a
trajectory as its own request, named by `turn_request_id` (the prompt's uid, the sample, the
prompt's length, the turn). The proposer reads the ids of new rows only (`parse_turn_request`):
a turn's row is the trajectory's sequence, its prompt the original prompt (not the conversation
so far), and a later turn continues the sequence the earlier one fed, taking the tool output
between them as what the model reads. A trajectory's sequence is parked between turns (not
ended at a turn's eos) until the driver's `srt_finish`.

A step's row state is a few arrays in row order (`StepRows`: slots, lengths, doneness and the
drafting state; the rows' tails beside them), carried to the next step by index (`track`'s
`src`), so a step touches no Python object per row that kept its sequence; rows that moved, came
back or are new take their state from their `TrackedSeq`, and a row that loses its sequence puts
it back (`_park`).

The tracker owns its sequences' lifecycle in the proposer's tree session: it starts one for a
row that holds a new sequence, and ends one (the session stores it) when the proposer says it is
done, when it has been out of the batch `PARK_STEPS` steps, or at `end_all`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from cache_store.store import TREE_DEPTH
from cache_store.uid import prompt_uid
from srtcli.rollout.drafters.prompt_trees import PromptTree
from srtcli.rollout.tree_session import TreeSession
from srtcli.rollout.vllm.counters import Counters

# tokens before a row's known length that recognise it (with the length) next step: as many as a
# draft reads, so only rows that end alike as far as a draft looks can be taken for each other
TAIL = TREE_DEPTH
PARK_STEPS = 256  # steps a sequence out of the batch may still come back as itself
TURN_PREFIX = "srt-turn:"


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
    group: PromptTree  # its own reference: a sequence of a group no longer in memory can still draft
    tail: Any = None  # the row's last `TAIL` tokens before `seen` (what recognises the row)
    last_draft: list = field(default_factory=list)  # what we proposed for the next step
    spec_len: int = -1  # adaptive draft length (-1: not started, = budget)
    done: bool = False  # eos or max_new_tokens reached: it takes no more tokens
    ended: bool = False  # committed (or waiting to be)
    early: bool = False  # ended by an idle commit before it was done: its row may still come back
    left: int = -1  # the step it left the batch at, while it may come back
    trajectory: str | None = None  # the driver's trajectory key (its turns are requests of their own)


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


def tail_of(window: np.ndarray, start: int, seen: int) -> np.ndarray | None:
    """The `TAIL` tokens before `seen` of a sequence whose tokens from `start` on are `window`,
    as `gather_tails` takes them (positions clipped at 0); None if the window does not hold them."""
    pos = np.maximum(seen - TAIL + np.arange(TAIL), 0) - start
    return window[pos] if pos.min() >= 0 and seen - start <= len(window) else None


def grown(seen: Any, done: Any, n: Any, k: Any) -> Any:
    """Whether a row `n` long that sampled `k` tokens is as long as a sequence `seen` long would
    be now: exactly what it had and those (a longer identical sibling, as greedy samples are, is
    not it); a done one at least what it had (it may hold junk after eos). Scalars or arrays."""
    return np.where(done, n >= seen, n - k == seen)


def turn_request_id(uid: str, sample: int, prompt_len: int, turn: int) -> str:
    """The vLLM request id of turn `turn` (0, 1, ...) of sample `sample` of the prompt `uid`
    whose first `prompt_len` tokens are the prompt."""
    return f"{TURN_PREFIX}{uid}:{sample}:{prompt_len}:{turn}"


def parse_turn_request(request_id: str) -> tuple[str, int] | None:
    """(trajectory key, prompt length) of a `turn_request_id` (vLLM may append its own suffix),
    or None for any other request."""
    if not request_id.startswith(TURN_PREFIX):
        return None
    parts = request_id[len(TURN_PREFIX):].split(":")
    if len(parts) < 4 or not parts[2].isdigit():
        return None
    return f"{parts[0]}:{parts[1]}", int(parts[2])


@dataclass
class StepRows:
    """One step's tracked rows as arrays, in the order of `RowTracker.rows` (kept for the next
    step as `RowTracker.last`)."""

    slots: np.ndarray
    seen: np.ndarray  # each row's length last step
    plen: np.ndarray
    spec: np.ndarray  # adaptive draft length (-1: not started)
    done: np.ndarray  # bool
    drafted: np.ndarray  # length of its last draft
    drafts: list  # its last draft
    seqs: list = field(default_factory=list)
    cores: list = field(default_factory=list)  # each row's compiled streams
    n: Any = None  # each row's length now
    verified: Any = None  # its last draft was verified this step

    @classmethod
    def empty(cls) -> "StepRows":
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, none, none.astype(bool), none, [])


class RowTracker:
    """Which sequence each row of vLLM's batch holds (`rows`, row -> sequence), the sequences
    out of the batch that may come back (`away`) and a driver's trajectories between turns, with
    their sequences started and ended in `session` (counted in `counters`). `request_ids` gives
    the batch's request ids in row order (a driver's turns are named), or is None."""

    def __init__(self, session: TreeSession, fingerprint: str, counters: Counters,
                 request_ids: Callable[[], Sequence[str]] | None = None):
        self.session, self.fingerprint, self.request_ids = session, fingerprint, request_ids
        self.c = counters
        self.rows: dict[int, TrackedSeq] = {}
        self.row_names: list[str] | None = None  # this step's request ids in row order (with `request_ids`)
        self.away: dict[int, TrackedSeq] = {}  # id -> sequence out of the batch that may come back
        self.trajectories: dict[str, TrackedSeq] = {}  # a driver's trajectories between turns, by key
        self.step = 0
        self._forget()

    # --- a step ---------------------------------------------------------------------------------
    def track(self, sampled: np.ndarray, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray) -> np.ndarray:
        """Take this step's rows (`sampled`: how many tokens each sampled): `rows` becomes row ->
        the sequence it holds now; per row (in that order) where its state was last step is
        returned, its index in `last`, or -1 (it moved, came back or is new: its `TrackedSeq`
        holds it). A tracked sequence no row holds any more has left."""
        self.step += 1
        self.row_names = list(self.request_ids()) if self.request_ids is not None else None
        self.rows, src = self._match(sampled, num_tokens_no_spec, token_ids_cpu)
        return src

    def gather(self, src: np.ndarray) -> StepRows:
        """This step's rows' state: last step's arrays at `src`, a `TrackedSeq`'s own where -1."""
        slots = np.fromiter(self.rows, np.int64, len(self.rows))
        p, j, seqs = self.last, np.maximum(src, 0), list(self.rows.values())
        cols = np.stack([p.seen, p.plen, p.spec, p.done, p.drafted]).take(j, axis=1) if len(p.slots) else \
            np.zeros((5, len(slots)), dtype=np.int64)
        drafts, cores = ([list(map(x.__getitem__, j.tolist())) for x in (p.drafts, p.cores)] if len(p.slots) else
                         ([None] * len(slots), [None] * len(slots)))
        for r in np.flatnonzero(src < 0).tolist():  # moved, returned or new
            s = seqs[r]
            cols[:, r] = s.seen, s.plen, s.spec_len, s.done, len(s.last_draft)
            drafts[r], cores[r] = s.last_draft, s.cores
        return StepRows(slots, cols[0], cols[1], cols[2], cols[3] > 0, cols[4], drafts, seqs, cores)

    def remember(self, rows: StepRows, ids: np.ndarray) -> None:
        """The step's rows after feeding and drafting, each with the `TAIL` tokens before its
        length (and its request id, where the driver names requests), for the next step."""
        self.last = rows
        self.tails = gather_tails(ids, rows.slots, rows.seen)
        self.names = [self.row_names[i] for i in rows.slots.tolist()] if self.row_names is not None else None

    def _forget(self) -> None:
        """No row is tracked (a new proposer, or after `end_all`)."""
        self.last, self.tails, self.names = StepRows.empty(), np.zeros((0, TAIL), dtype=np.int64), None

    # --- identification -------------------------------------------------------------------------
    def _new_seq(self, row: np.ndarray, plen: int) -> TrackedSeq:
        prompt = row[:plen].tolist()
        uid = prompt_uid(prompt, self.fingerprint)
        g, streams = self.session.start_sequence(uid, prompt[-1])
        self.session.count(g)
        return TrackedSeq(uid, plen, plen, streams, tuple(st.core for st in streams), g)

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

    def _arrived(self, free: dict[int, TrackedSeq], row: np.ndarray, n: int, k: int, i: int) -> TrackedSeq:
        """The sequence row `i` holds that is not the one it held: a driver's trajectory (named
        by its request id), a tracked one that moved, one that came back, else a new one whose
        prompt is the row without its `k` sampled tokens."""
        named = parse_turn_request(self.row_names[i]) if self.row_names is not None else None
        if named is not None:
            return self._turn(free, named[0], named[1], row, n - k)
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

    def _turn(self, free: dict[int, TrackedSeq], key: str, plen: int, row: np.ndarray, held: int) -> TrackedSeq:
        """The sequence of a driver's trajectory `key` whose row holds `held` tokens before this
        step's: the one its earlier turns fed, which goes on from where it stopped (the tool
        output between two turns is fed as what the model reads), else a new one of the prompt
        (the row's first `plen` tokens) starting at `held`."""
        s = self.trajectories.pop(key, None) or next((f for f in free.values() if f.trajectory == key), None)
        free.pop(id(s), None)
        if s is not None and not s.ended and s.seen <= held:
            if s.done:  # a new turn: its prompt's tail is tool output, fed whole (eos and all) as the model reads it
                for st in s.streams:
                    st.extend(row[s.seen:held].tolist())
                s.seen, s.done, s.last_draft = held, False, []  # that draft was for a step the turn never took
            return s
        s = self._new_seq(row, plen)
        s.seen, s.trajectory = held, key
        return s

    def _kept(self, sampled: np.ndarray, num: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Per tracked sequence (order of `rows`): whether its row still holds it (`_continues`), at once."""
        p = self.last
        same = np.zeros(len(p.slots), dtype=bool)
        live = p.slots < len(sampled)
        if live.any():
            slots, seen = p.slots[live], p.seen[live]
            same[live] = grown(seen, p.done[live], num[slots], sampled[slots]) \
                & (gather_tails(ids, slots, seen) == self.tails[live]).all(1)
        if self.names is not None:  # a driver's next turn may take the row its last turn held
            same &= np.array([slot < len(self.row_names) and self.names[j] == self.row_names[slot]
                              for j, slot in enumerate(p.slots.tolist())], dtype=bool)
        return same

    def _match(self, sampled: np.ndarray, num_tokens_no_spec: np.ndarray,
               token_ids_cpu: np.ndarray) -> tuple[dict[int, TrackedSeq], np.ndarray]:
        """Row -> the sequence it holds now, and `track`'s `src`."""
        kept, prev, slots = self._kept(sampled, num_tokens_no_spec, token_ids_cpu), list(self.rows.values()), \
            self.last.slots
        src = np.flatnonzero(kept)
        src = src[np.argsort(slots[src], kind="stable")]  # rows that kept their sequence, by row
        cur = dict(zip(slots[src].tolist(), map(prev.__getitem__, src.tolist())))
        free = {}
        for j in np.flatnonzero(~kept).tolist():  # the others may have moved, left or come back later
            s = prev[j]
            self._park(s, j)
            free[id(s)] = s
        held = np.zeros(len(sampled), dtype=bool)
        held[slots[src]] = True
        arrived = np.flatnonzero((sampled > 0) & ~held).tolist()  # rows still prefilling sampled nothing
        for i in arrived:  # moved rows, returning and new sequences
            cur[i] = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]), int(sampled[i]), i)
        for s in free.values():
            self._left(s)
        return cur, np.concatenate([src, np.full(len(arrived), -1, dtype=np.int64)])

    # --- leaving and ending ---------------------------------------------------------------------
    def _park(self, s: TrackedSeq, j: int) -> None:
        """Sequence `j` of the kept arrays leaves them: its state goes back into its `TrackedSeq`."""
        p = self.last
        s.seen, s.done, s.tail = int(p.seen[j]), bool(p.done[j]), self.tails[j]
        s.spec_len, s.last_draft = int(p.spec[j]), p.drafts[j]

    def park_rows(self) -> None:
        """Every row's state back into its sequence (to read the sequences between steps)."""
        for j, s in enumerate(self.rows.values()):
            self._park(s, j)

    def _left(self, s: TrackedSeq) -> None:
        """A sequence left the batch (finished, preempted or skipped: it may come back); ends in
        `PARK_STEPS` (or at `end_all`), a driver's trajectory (between turns) at `end_all`. One an
        idle commit ended early is parked too: if its row comes back it goes on as itself."""
        if s.ended and not s.early:
            return
        if s.trajectory is not None:
            self.trajectories[s.trajectory] = s
        else:
            s.left = self.step
            self.away[id(s)] = s

    def expire(self) -> None:
        """End the sequences out of the batch for more than `PARK_STEPS` steps (after a step's feeding)."""
        # `away` is in leaving order (a returning one is re-inserted when it leaves again): expired ones first
        while self.away and self.step - (s := next(iter(self.away.values()))).left > PARK_STEPS:
            del self.away[id(s)]
            self.end(s)

    def end(self, s: TrackedSeq) -> None:
        """The sequence takes no more tokens: the session stores it (by its commit rule)."""
        if not s.ended:
            s.ended = True
            self.session.stop_sequence(s.streams[0])

    def live(self) -> list[TrackedSeq]:
        """The sequences in the batch and out of it (not a trajectory between turns)."""
        return [*self.rows.values(), *self.away.values()]

    def sequences(self) -> list[TrackedSeq]:
        """Every tracked sequence: in the batch, out of it, and trajectories between turns."""
        return [*self.live(), *self.trajectories.values()]

    def end_all(self) -> None:
        """End every sequence; no row is tracked any more (a row after this is a new sequence)."""
        for s in self.sequences():
            self.end(s)
        self.rows, self.away, self.trajectories = {}, {}, {}
        self._forget()
