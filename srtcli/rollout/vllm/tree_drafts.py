"""Tree feeding and drafting for the SRT proposer in vLLM's worker (no vLLM import,
so it is tested directly).

After every step vLLM hands over `token_ids_cpu[i, :num_tokens_no_spec[i]]`, the prompt plus
every token row i has kept so far (this step's sampled tokens already written), and wants one
list of draft ids per row. Drafts carry no probabilities, so vLLM verifies them as point masses
(lossless); we draft the most frequent path (`SuffixTree.draft`), as `--draft-mode greedy` does.

Each row's sequence is recognised from step to step by its tokens (`row_tracking.RowTracker`,
for a whole batch at once); rows with the same prompt (`prompt_uid` under the tokenizer's fingerprint) share one prompt tree of the
proposer's tree session (`srtcli.rollout.tree_session.TreeSession`, the one every drafting path
uses). A sequence is streamed into the trees up to and including eos or `max_new_tokens` and
ends there, or when it has been out of the batch too long; then the session stores it (batched,
by the session's commit rule, checked after every step).

A step's per-row work is two compiled calls over all rows (`suffix_tree.feed_many`, then
`draft_many`), the bookkeeping between them (the adaptive draft length, rooms, ends) on arrays.
Those arrays are the rows' state from step to step (`row_tracking.StepRows`, which the tracker
carries over), so a row that kept its sequence is read and written there only.
Every row's new tokens are in the trees before any row drafts, so it drafts from this step's too.
Both run on `ProposerSettings.threads` threads (appends one tree per thread at a time, so the
trees and drafts are the same for any number) once a step has `THREAD_TOKENS` new tokens or
`THREAD_ROWS` drafting rows: starting threads costs ~50 us, a production step's work ms.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

from cache_store.suffix_tree import draft_many, feed_many
from srtcli.rollout.drafters.draft_length import in_the_tail, next_draft_lengths
from srtcli.rollout.tree_session import COMMIT_EVERY, COMMIT_SECONDS, TreeSession
from srtcli.rollout.vllm.commits import IDLE_GROUPS, StepClock
from srtcli.rollout.vllm.counters import Counters
from srtcli.rollout.vllm.row_tracking import RowTracker, StepRows, TrackedSeq, tail_of
from srtcli.rollout.vllm.settings import ProposerSettings


FEED_THREADS = 4  # past 2-4 threads the run-wide tree, which every row feeds, bounds the appends
THREAD_TOKENS = 256  # new tokens in a step from which its appends use threads
THREAD_ROWS = 64  # drafting rows in a step from which its drafts do


def feed_threads() -> int:
    """The default `ProposerSettings.threads`: the cores this process may run on, at most `FEED_THREADS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(FEED_THREADS, cores))


class TreeDrafts:
    """The proposer's state: its settings, its tree session over `link` (a `StoreLink`, or
    None: trees without a store) and the rows its `RowTracker` tracks in it.
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
        self.c = Counters()
        self.tracker = self.tracker_type(self.session, settings.fingerprint, self.c, request_ids)
        self.clock = StepClock()
        self.lock = threading.RLock()

    tracker_type = RowTracker

    # --- the hook -----------------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Feed every row's new tokens to its trees; one list of draft ids per row."""
        with self.lock:
            self.clock.tick()
            self.session.step()  # the prompt trees built off the step that are due now
            self.c.steps += 1
            sampled = np.fromiter(map(len, sampled_token_ids), np.int64, len(sampled_token_ids))
            self.c.row_forwards += int(np.count_nonzero(sampled))
            num = np.asarray(num_tokens_no_spec)
            src = self.tracker.track(sampled, num, token_ids_cpu)
            out: list[list[int]] = [[] for _ in range(len(sampled_token_ids))]
            self._step(out, sampled, num, token_ids_cpu, src)
            self.tracker.expire()
            if self.session.due():
                self.flush()
            self.clock.tick()
            return out

    def _step(self, out: list, sampled: np.ndarray, num: np.ndarray, ids: np.ndarray,
              src: np.ndarray) -> None:
        """Every tracked row at once, in two compiled calls: feed its new tokens and adapt its
        draft length (`_feed`), then draft for the rows that sampled; the tracker keeps their
        state for the next step."""
        b = self.tracker.gather(src)
        if len(b.slots):
            self._feed(b, num[b.slots].astype(np.int64), ids)
            self._draft(b, out, sampled)
        self.tracker.remember(b, ids)

    def _feed(self, b: StepRows, n: np.ndarray, ids: np.ndarray) -> None:
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
                self.tracker.end(b.seqs[r])
        # an ended row has taken its tokens up to its eos (vLLM may have kept drafts past it):
        # a trajectory's next turn goes on from there
        b.seen, b.done = np.where(ended, b.seen + fed, np.where(fresh, n, b.seen)), b.done | ended

    def _draft(self, b: StepRows, out: list, sampled: np.ndarray) -> None:
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
            # a trajectory between turns may be waiting for a tool
            stopped = [s for s in self.tracker.live() if s.trajectory is None and not s.ended]
            for s in stopped:
                s.early = True
                self.tracker.end(s)
            if stopped or self.session.waiting:
                self.c.idle_commits += 1
                self.flush()

    def complete(self, ends: Sequence[tuple[str, int, Sequence[int]]]) -> None:
        """Feed each sequence that is not done what its request ended with, as a driver got it:
        (prompt uid, length, its last tokens) per request. vLLM does not always hand the
        proposer a request's last step (a batch's final steps), so without this its stored copy
        would miss the tokens of that step. A sequence is the request whose last tokens hold its
        `TAIL` tokens at its length (each request taken once); it takes the rest up to eos or the
        length cap."""
        self.tracker.park_rows()
        by_uid: dict[str, list] = {}
        for uid, n, last in ends:
            by_uid.setdefault(uid, []).append((n - len(last), np.asarray(last, dtype=np.int64)))
        for s in self.tracker.sequences():
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
            self.tracker.end_all()
            self.flush()
            trees = self.session.trees
            self.c.groups, self.c.hits = trees.loaded, trees.hits
            trees.loaded = trees.hits = 0
            return self.c.take()
