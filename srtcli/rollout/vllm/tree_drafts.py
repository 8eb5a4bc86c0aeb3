"""Tree feeding and drafting for the SRT proposer in vLLM's worker (no vLLM import,
so it is tested directly).

After every step vLLM hands over `token_ids_cpu[i, :num_tokens_no_spec[i]]`, the prompt plus
every token row i has kept so far (this step's sampled tokens already written), and wants one
list of draft ids per row. Drafts carry no probabilities, so vLLM verifies them as point masses
(lossless); we draft the most frequent path (`SuffixTree.draft`), as `--draft-mode greedy` does.

Each row's sequence is recognised from step to step by its tokens (`row_tracking` says how;
`_track` does it for a whole batch at once); rows with
the same prompt (`prompt_uid` under the tokenizer's fingerprint) share one prompt tree of the
proposer's tree session (`srtcli.rollout.tree_session.TreeSession`, the one every drafting path
uses). A sequence is streamed into the trees up to and including eos or `max_new_tokens` and
ends there, or when it has been out of the batch too long; then the session stores it (batched,
by the session's commit rule, checked after every step).

A step's per-row work is two compiled calls over all rows (`suffix_tree.feed_many`, then
`draft_many`), the bookkeeping between them (the adaptive draft length, rooms, ends) on arrays.
Those arrays are the rows' state from step to step (`last`, carried over by `_track`'s index),
so a row that kept its sequence is read and written there only; rows that moved, came back or
are new take their state from their `TrackedSeq`, and a row that loses its sequence puts it back.
Every row's new tokens are in the trees before any row drafts, so it drafts from this step's too.
Both run on `ProposerSettings.threads` threads (appends one tree per thread at a time, so the
trees and drafts are the same for any number) once a step has `THREAD_TOKENS` new tokens or
`THREAD_ROWS` drafting rows: starting threads costs ~50 us, a production step's work ms.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from cache_store.uid import prompt_uid
from cache_store.suffix_tree import draft_many, feed_many
from srtcli.rollout.drafters.draft_length import in_the_tail, next_draft_lengths
from srtcli.rollout.tree_session import COMMIT_EVERY, COMMIT_SECONDS, TreeSession
from srtcli.rollout.vllm.commits import IDLE_GROUPS, StepClock
from srtcli.rollout.vllm.counters import Counters
from srtcli.rollout.vllm.row_tracking import (PARK_STEPS, TAIL, TrackedSeq, gather_tails, grown, parse_turn_request,
                                              tail_of)
from srtcli.rollout.vllm.settings import ProposerSettings


FEED_THREADS = 4  # past 2-4 threads the run-wide tree, which every row feeds, bounds the appends
THREAD_TOKENS = 256  # new tokens in a step from which its appends use threads
THREAD_ROWS = 64  # drafting rows in a step from which its drafts do


def feed_threads() -> int:
    """The default `ProposerSettings.threads`: the cores this process may run on, at most `FEED_THREADS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(FEED_THREADS, cores))


@dataclass
class _Rows:
    """One step's tracked rows as arrays, in the order of `TreeDrafts.rows` (kept for the next
    step as `TreeDrafts.last`)."""

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
    def empty(cls) -> "_Rows":
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, none, none.astype(bool), none, [])


class TreeDrafts:
    """The proposer's state: its settings, the tracked rows, and its tree session over `link`
    (a `StoreLink`, or None: trees without a store).
    `settings.fingerprint` must be set (`worker_facts.completed`). Thread-safe: vLLM's step and the
    proposer's idle-commit thread both come through the lock. With `max_num_seqs` (vLLM's), a
    step of at most a quarter of that many rows is the long tail: every row drafts the whole
    budget whatever its adaptive length (`in_the_tail`)."""

    def __init__(self, settings: ProposerSettings, budget: int, max_model_len: int, link: Any = None,
                 commit_every: int = COMMIT_EVERY, commit_seconds: float = COMMIT_SECONDS,
                 idle_groups: int = IDLE_GROUPS, max_num_seqs: int | None = None,
                 request_ids: Callable[[], Sequence[str]] | None = None):
        if not settings.fingerprint or settings.adaptive is None:
            raise ValueError("TreeDrafts needs completed settings: fingerprint and adaptive set (worker_facts)")
        self.settings, self.budget, self.max_model_len = settings, budget, max_model_len
        self.max_num_seqs = max_num_seqs
        self.cap = settings.max_new_tokens if settings.max_new_tokens is not None else max_model_len
        self.eos_ids = np.array(sorted(set(settings.eos_ids or ())), dtype=np.int64)
        self.threads = settings.threads or feed_threads()
        self.session = TreeSession(link, shared=settings.shared, load_tokens=settings.load_tokens,
                                   load_steps=settings.load_steps, idle_groups=idle_groups,
                                   commit_every=commit_every, commit_seconds=commit_seconds)
        self.rows: dict[int, TrackedSeq] = {}
        self.request_ids = request_ids  # the batch's request ids in row order (a driver's turns), or None
        self.row_names: list[str] | None = None  # this step's request ids in row order (with `request_ids`)
        self._forget()
        self.away: dict[int, TrackedSeq] = {}  # id -> sequence out of the batch that may come back
        self.trajectories: dict[str, TrackedSeq] = {}  # a driver's trajectories between turns, by key
        self.step, self.clock = 0, StepClock()
        self.lock = threading.RLock()
        self.c = Counters()

    # --- identification -------------------------------------------------------------------
    def _new_seq(self, row: np.ndarray, plen: int) -> TrackedSeq:
        prompt = row[:plen].tolist()
        uid = prompt_uid(prompt, self.settings.fingerprint)
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
        same = np.zeros(len(self.slots), dtype=bool)
        live = self.slots < len(sampled)
        if live.any():
            slots, seen = self.slots[live], self.seen[live]
            same[live] = grown(seen, self.done[live], num[slots], sampled[slots]) \
                & (gather_tails(ids, slots, seen) == self.tails[live]).all(1)
        if self.names is not None:  # a driver's next turn may take the row its last turn held
            same &= np.array([slot < len(self.row_names) and self.names[j] == self.row_names[slot]
                              for j, slot in enumerate(self.slots.tolist())], dtype=bool)
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
            cur[i] = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]), int(sampled[i]), i)
        for s in free.values():
            self._left(s)
        return cur, np.concatenate([src, np.full(len(arrived), -1, dtype=np.int64)])

    def _park(self, s: TrackedSeq, j: int) -> None:
        """Sequence `j` of the kept arrays leaves them: its state goes back into its `TrackedSeq`."""
        s.seen, s.done, s.tail = int(self.seen[j]), bool(self.done[j]), self.tails[j]
        s.spec_len, s.last_draft = int(self.last.spec[j]), self.last.drafts[j]

    def _left(self, s: TrackedSeq) -> None:
        """A sequence left the batch (finished, preempted or skipped: it may come back); ends in
        `PARK_STEPS` (or at `finish`), a driver's trajectory (between turns) at `finish`. One an
        idle commit ended early is parked too: if its row comes back it goes on as itself."""
        if s.ended and not s.early:
            return
        if s.trajectory is not None:
            self.trajectories[s.trajectory] = s
        else:
            s.left = self.step
            self.away[id(s)] = s

    def _expire(self) -> None:
        # `away` is in leaving order (a returning one is re-inserted when it leaves again): expired ones first
        while self.away and self.step - (s := next(iter(self.away.values()))).left > PARK_STEPS:
            del self.away[id(s)]
            self._end(s)

    def _remember(self, slots: np.ndarray, seen: np.ndarray, done: np.ndarray, ids: np.ndarray) -> None:
        """Each tracked row's slot, length, doneness and `TAIL` tokens before it (and its request
        id, where the driver names requests), for the next step."""
        self.slots, self.seen, self.done = slots, seen, done
        self.tails = gather_tails(ids, slots, seen)
        self.names = [self.row_names[i] for i in slots.tolist()] if self.row_names is not None else None

    # --- the hook -----------------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Feed every row's new tokens to its trees; one list of draft ids per row."""
        with self.lock:
            self.clock.tick()
            self.session.step()  # the prompt trees built off the step that are due now
            self.step += 1
            self.c.steps += 1
            sampled = np.fromiter(map(len, sampled_token_ids), np.int64, len(sampled_token_ids))
            self.c.row_forwards += int(np.count_nonzero(sampled))
            num = np.asarray(num_tokens_no_spec)
            self.row_names = list(self.request_ids()) if self.request_ids is not None else None
            self.rows, src = self._track(sampled, num, token_ids_cpu)
            out: list[list[int]] = [[] for _ in range(len(sampled_token_ids))]
            self._remember(*self._step(out, sampled, num, token_ids_cpu, src), token_ids_cpu)
            self._expire()
            if self.session.due():
                self.flush()
            self.clock.tick()
            return out

    def _step(self, out: list, sampled: np.ndarray, num: np.ndarray, ids: np.ndarray,
              src: np.ndarray) -> tuple[np.ndarray, ...]:
        """Every tracked row at once, in two compiled calls: feed its new tokens and adapt its
        draft length (`_feed`), then draft for the rows that sampled. Returns the rows' slots,
        lengths and whether each is done."""
        slots = np.fromiter(self.rows, np.int64, len(self.rows))
        b = self._gather(slots, src)
        if len(slots):
            self._feed(b, num[slots].astype(np.int64), ids)
            self._draft(b, out, sampled)
        self.last = b
        return b.slots, b.seen, b.done

    def _gather(self, slots: np.ndarray, src: np.ndarray) -> _Rows:
        """This step's rows' state: last step's arrays at `src`, a `TrackedSeq`'s own where -1."""
        p, j, seqs = self.last, np.maximum(src, 0), list(self.rows.values())
        cols = np.stack([p.seen, p.plen, p.spec, p.done, p.drafted]).take(j, axis=1) if len(p.slots) else \
            np.zeros((5, len(slots)), dtype=np.int64)
        drafts, cores = ([list(map(x.__getitem__, j.tolist())) for x in (p.drafts, p.cores)] if len(p.slots) else
                         ([None] * len(slots), [None] * len(slots)))
        for r in np.flatnonzero(src < 0).tolist():  # moved, returned or new
            s = seqs[r]
            cols[:, r] = s.seen, s.plen, s.spec_len, s.done, len(s.last_draft)
            drafts[r], cores[r] = s.last_draft, s.cores
        return _Rows(slots, cols[0], cols[1], cols[2], cols[3] > 0, cols[4], drafts, seqs, cores)


    def _forget(self) -> None:
        """No row is tracked (a new proposer, or after `finish`)."""
        self.last = _Rows.empty()
        self._remember(self.last.slots, self.last.seen, self.last.done, np.zeros((0, TAIL), dtype=np.int64))

    def _feed(self, b: _Rows, n: np.ndarray, ids: np.ndarray) -> None:
        """Each row's new tokens into its trees (up to and including eos or `max_new_tokens`,
        where its sequence ends), what its last draft predicted, and its next draft length."""
        b.n = n
        fresh = (n > b.seen) & ~b.done  # rows with new tokens to take
        ends = np.where(fresh, n, b.seen)
        threads = self.threads if int((ends - b.seen).sum()) >= THREAD_TOKENS else 1
        fed, accepted = (np.array(x, dtype=np.int64) for x in feed_many(
            b.cores, ids, b.slots, b.seen, ends, b.plen + self.cap, self.eos_ids, b.drafts, threads))
        # vLLM samples one token past what it accepts of a verified draft, so a draft that predicted
        # every new token was cut (to the step's token budget) or dropped (a preempted row is
        # recomputed): vLLM accepted one fewer
        accepted = np.minimum(accepted, np.maximum(ends - b.seen - 1, 0))
        b.verified = fresh & (b.drafted > 0)  # its draft's verdict: kept drafts come first in the new tokens
        self.c.accepted_tokens += int(accepted[b.verified].sum())
        if self.settings.adaptive:
            b.spec = np.where(b.verified, next_draft_lengths(b.spec, self.budget, b.drafted, accepted), b.spec)
        last = ids[b.slots, np.maximum(b.seen + fed - 1, 0)]
        ended = fresh & ((fed < n - b.seen) | ((fed > 0) & (last[:, None] == self.eos_ids).any(1))
                         | (b.seen - b.plen + fed >= self.cap))
        for r in np.flatnonzero(ended).tolist():
            if b.seqs[r].trajectory is None:  # a trajectory's turn ended: its next turn may follow
                self._end(b.seqs[r])
        # an ended row has taken its tokens up to its eos (vLLM may have kept drafts past it):
        # a trajectory's next turn goes on from there
        b.seen, b.done = np.where(ended, b.seen + fed, np.where(fresh, n, b.seen)), b.done | ended

    def _draft(self, b: _Rows, out: list, sampled: np.ndarray) -> None:
        """A draft for every row that sampled and takes more tokens, in its `out` slot; a row's
        drafted or verified draft is replaced by this one (a verified draft is spent)."""
        drafting = (sampled[b.slots] > 0) & ~b.done
        b.spec = np.where(drafting & (b.spec < 0), self.budget, b.spec)  # a first draft: the whole budget
        tail = self.max_num_seqs is not None and in_the_tail(len(sampled), self.max_num_seqs)
        room = np.minimum(self.budget if tail else b.spec,
                          np.minimum(self.max_model_len - b.n - 1, self.cap - (b.n - b.plen) - 1))
        threads = self.threads if np.count_nonzero(drafting) >= THREAD_ROWS else 1
        drafts = draft_many(b.cores, np.where(drafting, room, 0), self.settings.min_prob, threads)
        lengths = np.fromiter(map(len, drafts), np.int64, len(drafts))
        self.c.drafted(int(drafting.sum()), lengths)
        for i, d in zip(b.slots.tolist(), drafts):
            out[i] = d
        new = drafting | b.verified
        for r in np.flatnonzero(~new).tolist():
            drafts[r] = b.drafts[r]
        b.drafts, b.drafted = drafts, np.where(new, lengths, b.drafted)

    # --- ending -------------------------------------------------------------------------------
    def _end(self, s: TrackedSeq) -> None:
        if not s.ended:
            s.ended = True
            self.session.stop_sequence(s.streams[0])

    def flush(self) -> None:
        """Append the ended sequences in one transaction (the writer rank only)."""
        with self.lock:
            if self.session.commit():
                self.c.commits += 1

    def commit_if_idle(self, seconds: float | None = None) -> None:
        """When vLLM is idle (`StepClock.idle`, `seconds` default commit_seconds) nothing runs:
        the rows of its last step have ended, whether a step showed it or not (vLLM does not
        always hand over a batch's final step), and so have those out of the batch (a server's
        finished requests whose last step vLLM never handed over). End them all and append. A
        step that only stalled looks the same, so each stays tracked or parked: a row that steps
        again, or comes back after vLLM preempted or skipped it, drafts on as the same sequence
        (never a second copy of its tokens); only its stored copy stops here."""
        with self.lock:
            idle = self.clock.idle(self.session.commit_seconds if seconds is None else seconds)
            if not idle:
                return
            live = [*self.rows.values(), *self.away.values()]
            stopped = [s for s in live if s.trajectory is None and not s.ended]  # a trajectory may wait for a tool
            for s in stopped:
                s.early = True
                self._end(s)
            if stopped or self.session.waiting:
                self.c.idle_commits += 1
                self.flush()

    def _end_all(self, seqs: dict) -> None:
        for s in list(seqs.values()):
            self._end(s)
        seqs.clear()

    def complete(self, ends: Sequence[tuple[str, int, Sequence[int]]]) -> None:
        """Feed each sequence that is not done what its request ended with, as a driver got it:
        (prompt uid, length, its last tokens) per request. vLLM does not always hand the
        proposer a request's last step (a batch's final steps), so without this its stored copy
        would miss the tokens of that step. A sequence is the request whose last tokens hold its
        `TAIL` tokens at its length (each request taken once); it takes the rest up to eos or the
        length cap."""
        for j, s in enumerate(self.rows.values()):  # the rows' state back into their sequences
            self._park(s, j)
        by_uid: dict[str, list] = {}
        for uid, n, last in ends:
            by_uid.setdefault(uid, []).append((n - len(last), np.asarray(last, dtype=np.int64)))
        for s in [*self.rows.values(), *self.away.values(), *self.trajectories.values()]:
            if s.ended or s.done:
                continue
            candidates = by_uid.get(s.uid, [])
            for k, (start, window) in enumerate(candidates):
                tail = tail_of(window, start, s.seen)
                if tail is not None and np.array_equal(tail, s.tail):
                    self._take_rest(s, window[s.seen - start:].tolist())
                    del candidates[k]
                    break

    def _take_rest(self, s: TrackedSeq, rest: list[int]) -> None:
        """The tokens a sequence did not see, up to and including eos or its length cap."""
        rest = rest[:max(s.plen + self.cap - s.seen, 0)]
        eos = next((i for i, t in enumerate(rest) if t in set(self.eos_ids.tolist())), None)
        rest = rest if eos is None else rest[:eos + 1]
        for st in s.streams:
            st.extend(rest)
        s.seen, s.done = s.seen + len(rest), True

    def finish(self, ends: Sequence[tuple[str, int, Sequence[int]]] | None = None) -> dict[str, int]:
        """End every sequence (completed from `ends` first, where a driver passes them), append,
        return and reset the counters (the groups stay in memory; a row after this is a new
        sequence)."""
        with self.lock:
            if ends:
                self.complete(ends)
            self._end_all(self.rows)
            self._end_all(self.away)
            self._end_all(self.trajectories)
            self._forget()
            self.flush()
            trees = self.session.trees
            self.c.groups, self.c.hits = trees.loaded, trees.hits
            trees.loaded = trees.hits = 0
            out = dict(self.c.__dict__)
            self.c = Counters()
            return out
