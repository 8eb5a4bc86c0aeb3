"""The proposer's incremental row tracking (a row is recognised by its length and the tokens
before it) gives the same drafts and stores the same sequences as recognising every row by
its whole token row, on random vLLM-like step sequences: rows that move (condense, swaps),
preempted requests that come back (as themselves), finished rows (eos, junk after eos, the
length cap), a prompt that is a prefix of another, a shrinking batch; and the batched feeding
and drafting (two compiled calls a step) equals feeding and drafting row by row in Python."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cache_store.seqstore import LmdbSequenceStore
from cache_store.uid import prompt_uid
from srtcli.store_link import StoreLink
from srtcli.rollout.drafters.draft_length import in_the_tail, next_draft_length
from cache_store.store import TREE_DEPTH
from srtcli.rollout.vllm.settings import ProposerSettings
from srtcli.rollout.vllm.row_tracking import (TAIL, RowTracker, gather_tails, parse_turn_request, tail_of,
                                              turn_request_id)
from srtcli.rollout.vllm.tree_drafts import TreeDrafts
from tests.srtcli.rollout.context_drafts import context_draft

EOS, MAX_NEW, WIDTH, FP = 2, 40, 96, "tok1-test"
PROMPTS = {prompt_uid(p, FP): p for p in ([5, 6, 7], [5, 6, 7, 8, 9], [11, 12], [13, 14, 15, 16])}
OTHER = [99, 98, 97]  # a few more requests, one sample each


class WholeRowTracker(RowTracker):
    """The reference tracker: a row continues a sequence if it starts with every token the
    sequence had (the whole row compared every step, the history concatenated)."""

    def _new_seq(self, row, plen):
        s = super()._new_seq(row, plen)
        s.hist = np.array(row[:plen], dtype=np.int64)  # every token of the row seen so far
        return s

    def _continues(self, s, row, n, k) -> bool:
        m = len(s.hist)  # exactly what it had and this step's k tokens (a done one: at least)
        return (n >= m if s.done else n - k == m) and np.array_equal(row[:m], s.hist)

    def _moved(self, free, row, n, k):
        return next((s for s in free.values() if self._continues(s, row, n, k)), None)

    def _match(self, sampled, num, ids):
        prev, cur = self.rows, {}
        free = {id(s): s for s in prev.values()}
        for i in range(len(sampled)):
            s = prev.get(i)
            if s is not None and self._continues(s, ids[i], int(num[i]), int(sampled[i])):
                cur[i] = s
                free.pop(id(s), None)
        for i in range(len(sampled)):
            if i in cur or not sampled[i]:  # sampled: each row's number of sampled tokens
                continue
            cur[i] = self._arrived(free, ids[i], int(num[i]), int(sampled[i]), i)
        for s in free.values():
            self._left(s)
        return cur, None


class WholeRowTracking(TreeDrafts):
    """The reference: rows tracked by `WholeRowTracker`, fed and drafted one at a time in
    Python, drafts looked up from the row's last tokens in the group's tree and the run-wide
    tree."""

    tracker_type = WholeRowTracker

    def _step(self, out, sampled, num, ids, src):
        """One row at a time in Python: every row's new tokens, then every row's draft."""
        rows = self.tracker.rows
        for i, s in rows.items():
            self._feed(s, ids[i], int(num[i]))
        tail = in_the_tail(len(sampled), self.max_num_seqs)
        for i, s in rows.items():
            if sampled[i] and not s.done:
                out[i] = s.last_draft = self._draft(s, ids[i], int(num[i]), tail)

    def _feed(self, s, row, n) -> None:
        seen = s.hist
        if n <= len(seen) or s.done:
            return
        new = row[len(seen):n].tolist()
        if s.last_draft:  # count the kept drafts (they come first) and adapt the draft length
            a = 0
            while a < min(len(new), len(s.last_draft)) and new[a] == s.last_draft[a]:
                a += 1
            a = min(a, len(new) - 1)  # vLLM samples one token past what it accepts
            self.c.accepted_tokens += a
            s.spec_len = next_draft_length(s.spec_len, self.budget, len(s.last_draft), a)
            s.last_draft = []
        self._take(s, new)
        s.hist = np.concatenate([seen, np.asarray(new, dtype=np.int64)])
        s.seen = n

    def _take(self, s, new) -> None:
        """Up to and including eos or `max_new_tokens`; the sequence ends there."""
        left = self.cap - (len(s.hist) - s.plen)
        keep = new[:max(left, 0)]
        if EOS in keep:
            keep = keep[: keep.index(EOS) + 1]
        for st in s.streams:
            st.extend(keep)
        if len(keep) < len(new) or (keep and keep[-1] == EOS) or len(s.hist) - s.plen + len(keep) >= self.cap:
            s.done = True
            self.tracker.end(s)

    def _draft(self, s, row, n, tail):
        self.c.rows += 1
        if s.spec_len < 0:
            s.spec_len = self.budget
        room = min(self.budget if tail else s.spec_len, self.max_model_len - n - 1, self.cap - (n - s.plen) - 1)
        if room <= 0:
            return []
        ctx = [int(row[s.plen - 1])] + row[s.plen:n][-(TREE_DEPTH - 1):].tolist()
        toks = context_draft(s.group.tree, self.session.trees.shared, ctx, room, self.settings.min_prob)
        if toks:
            self.c.drafted_rows += 1
            self.c.drafted_tokens += len(toks)
        return list(toks)


def requests(rng: random.Random, n: int, lead: list[int]) -> list[list]:
    """[prompt ids, output] per request: K=3 per prompt (each prompt after `lead`), copies of a
    few paths over a small vocabulary (rows often share their last tokens), some ended by eos
    (junk after it), some past the cap, and three requests of one more prompt."""
    out = []
    for p in [lead + p for p in PROMPTS.values()] * (n // 12 + 1):
        path = [rng.randrange(20, 26) for _ in range(MAX_NEW + 20)]
        for _ in range(3):
            o = [t if rng.random() > 0.1 else rng.randrange(20, 26) for t in path[: rng.randint(1, MAX_NEW + 12)]]
            if rng.random() < 0.4:
                o = o[: rng.randint(0, len(o))] + [EOS, 33]
            out.append([list(p), o])
    out += [[lead + OTHER, [rng.randrange(20, 26) for _ in range(8)]] for _ in range(3)]
    rng.shuffle(out)
    return out


class Steps:
    """vLLM's persistent batch over `requests`: prefill steps that sample nothing, 1-4 kept
    tokens a step, finished requests leaving (new ones take the lowest free rows, the last rows
    fill the other holes), rows swapped (vLLM reorders its batch), preempted requests going
    back to the queue and returning as prompt + what they had kept."""

    def __init__(self, rng: random.Random, reqs: list[list], slots: int, width: int):
        self.rng, self.waiting, self.slots = rng, reqs, slots
        self.ids = np.zeros((slots, width), dtype=np.int64)
        self.num = np.zeros(slots, dtype=np.int64)
        self.rows: list[list] = []  # [prompt, output, kept, prefilled]

    def admit(self, i: int) -> None:
        p, o, kept = (self.waiting.pop(0) + [0])[:3]
        self.ids[i] = 0
        self.ids[i, : len(p) + kept] = p + o[:kept]
        self.num[i] = len(p) + kept
        if i == len(self.rows):
            self.rows.append(None)
        self.rows[i] = [p, o, kept, False]

    def sampled(self) -> list[list[int]]:
        out = []
        for i, r in enumerate(self.rows):
            if not r[3]:
                r[3] = True
                out.append([])
                continue
            take = r[1][r[2]: r[2] + self.rng.randint(1, 4)]
            self.ids[i, self.num[i]: self.num[i] + len(take)] = take
            self.num[i] += len(take)
            r[2] += len(take)
            out.append(take)
        return out

    def reshape(self) -> None:
        rows, rng = self.rows, self.rng
        holes = [i for i, r in enumerate(rows) if r[2] >= len(r[1])]
        for i in [i for i in range(len(rows)) if i not in holes and rng.random() < 0.03]:
            self.waiting.insert(rng.randint(0, len(self.waiting)), rows[i][:3])  # preempted
            holes.append(i)
        holes.sort()
        while holes and self.waiting and rng.random() < 0.7:
            self.admit(holes.pop(0))
        for i in sorted(holes, reverse=True):  # condense
            last = len(rows) - 1
            self.ids[i], self.num[i], rows[i] = self.ids[last], self.num[last], rows[last]
            rows.pop()
        while self.waiting and len(rows) < self.slots and rng.random() < 0.8:
            self.admit(len(rows))
        if len(rows) > 1 and rng.random() < 0.2:  # reorder: swap two rows
            i, j = rng.sample(range(len(rows)), 2)
            self.ids[[i, j]], self.num[[i, j]] = self.ids[[j, i]], self.num[[j, i]]
            rows[i], rows[j] = rows[j], rows[i]


def drive(drafts: TreeDrafts, seed: int, slots: int, lead: list[int]) -> tuple[list, dict]:
    rng = random.Random(seed)
    steps = Steps(rng, requests(rng, 24, lead), slots, WIDTH + len(lead))
    proposals = []
    while steps.waiting or steps.rows:
        if not steps.rows:
            steps.admit(0)
        sampled = steps.sampled()
        proposals.append(drafts.propose(sampled, steps.num.copy(), steps.ids.copy()))
        steps.reshape()
    return proposals, drafts.finish()


def stored(store: LmdbSequenceStore) -> dict[str, list[tuple[int, ...]]]:
    return {u: sorted(tuple(x.tokens) for x in store.read(u)) for u in store.uids()}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("lead", [0, TAIL + 2], ids=["short-prompts", "prompts-past-the-tail"])
def test_incremental_tracking_drafts_and_stores_what_whole_row_tracking_does(tmp_path, seed, shared, lead):
    """Short prompts: rows shorter than `TAIL` are recognised token by token; prompts past it
    (as in production): by whole windows (`gather_tails`)."""
    lead = list(range(100, 100 + lead))
    settings = ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, shared=shared, fingerprint=FP)
    got, want = {}, {}
    for name, cls, out in (("new", TreeDrafts, got), ("ref", WholeRowTracking, want)):
        settings.cache = str(tmp_path / name)
        with LmdbSequenceStore.open(tmp_path / name) as store:
            d = cls(settings, 4, WIDTH + len(lead) - 8, link=StoreLink(store), commit_every=2, max_num_seqs=5)
            out["drafts"], out["counts"] = drive(d, seed, 5, lead)
            out["stored"] = stored(store)
    assert got["drafts"] == want["drafts"]
    assert got["stored"] == want["stored"] and got["counts"] == want["counts"]
    assert want["counts"]["drafted_tokens"] > 0 and want["counts"]["resumed_rows"] > 0
    assert {prompt_uid(lead + p, FP) for p in PROMPTS.values()} <= set(want["stored"])


def test_a_row_whose_tokens_before_its_length_changed_is_not_taken_for_the_same_sequence():
    d = TreeDrafts(ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, fingerprint=FP), 4, WIDTH - 8)
    p = [11, 12]
    ids = np.zeros((1, WIDTH), dtype=np.int64)
    ids[0, : len(p) + 3] = p + [20, 21, 22]
    d.propose([[20, 21, 22]], np.array([len(p) + 3]), ids)
    first = d.tracker.rows[0]
    ids[0, len(p) + 1] = 25  # another sequence of the prompt, as long, now in the row
    ids[0, len(p) + 3] = 23
    d.propose([[25, 22, 23]], np.array([len(p) + 4]), ids)
    assert d.tracker.rows[0] is not first and first in d.tracker.away.values()  # out of the batch: it may come back
    d.finish()
    assert first.ended


def test_identical_samples_that_trade_rows_are_each_still_themselves():
    """Greedy samples of a prompt are identical: a longer one now in the row a shorter one held
    starts with the same tokens, but it is not that one (its length is not what that one had
    plus this step's tokens), so neither is taken for the other nor for a new sequence."""
    d = TreeDrafts(ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, fingerprint=FP), 4, WIDTH - 8)
    full = [11, 12] + [20 + i % 5 for i in range(40)]
    ids = np.zeros((2, WIDTH), dtype=np.int64)
    n = [3, 3]

    def step(rows, k):  # rows: which sample each row holds now; k: tokens each sample takes
        for s, kk in enumerate(k):
            n[s] += kk
        ids[:] = 0
        for r, s in enumerate(rows):
            ids[r, : n[s]] = full[: n[s]]
        d.propose([[0] * k[s] for s in rows], np.array([n[s] for s in rows]), ids)

    step([0, 1], [0, 0])
    for _ in range(4):
        step([0, 1], [1, 5])  # the second sample runs ahead of the first
    t = d.tracker
    a, b = t.rows[0], t.rows[1]
    step([1, 0], [1, 1])  # vLLM reorders its batch: they trade rows
    assert t.rows[0] is b and t.rows[1] is a and t.last.seen.tolist() == [n[1], n[0]]  # row state, in row order
    assert d.session.waiting == 0 and t.away == {}  # no sequence left, none started anew


def test_rows_after_a_finished_batch_are_new_sequences_of_the_next():
    d = TreeDrafts(ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, fingerprint=FP), 4, WIDTH - 8)
    p = [11, 12]
    ids = np.zeros((2, WIDTH), dtype=np.int64)
    ids[:, : len(p) + 2] = p + [20, 21]
    d.propose([[20, 21], [20, 21]], np.array([len(p) + 2] * 2), ids)
    first = d.finish()
    assert first["rows"] == 2 and d.tracker.rows == {}
    ids[0, len(p) + 2] = 22  # the next generate: the same prompt in row 0, one row
    d.propose([[20, 21, 22]], np.array([len(p) + 3]), ids)
    assert d.tracker.last.seen.tolist() == [len(p) + 3] and not d.tracker.rows[0].ended and d.c.rows == 1


@pytest.mark.parametrize("short", [False, True], ids=["every-row-past-the-tail", "a-row-shorter"])
def test_a_rows_tail_is_the_tokens_just_before_its_length(short):
    """`gather_tails` against its definition, per row: the `TAIL` tokens before its length,
    positions before the row's start clipped to its first token; rows in any order of slots."""
    rng = np.random.default_rng(0)
    for dtype in (np.int32, np.int64):
        ids = rng.integers(0, 1000, (7, 3 * TAIL)).astype(dtype)
        slots = rng.permutation(7)[:5]
        seen = rng.integers(TAIL, 3 * TAIL + 1, 5)
        if short:
            seen[2] = TAIL // 3
        want = np.array([[ids[i, max(p, 0)] for p in range(n - TAIL, n)] for i, n in zip(slots, seen)])
        got = gather_tails(ids, slots, seen)
        assert got.dtype == ids.dtype and np.array_equal(got, want)


def test_a_requests_last_tokens_give_the_same_tail_when_they_hold_it():
    """`tail_of` (what a driver's batch end is matched by) on a sequence's last tokens agrees with
    `gather_tails` on the whole row, and says None when the last tokens start too late."""
    row = np.random.default_rng(1).integers(0, 1000, 3 * TAIL)
    for seen, start in ((2 * TAIL, TAIL), (2 * TAIL, 0), (TAIL // 3, 0)):
        want = gather_tails(row[None], np.zeros(1, np.int64), np.array([seen]))[0]
        assert np.array_equal(tail_of(row[start:], start, seen), want)
    assert tail_of(row[TAIL + 1:], TAIL + 1, 2 * TAIL) is None and tail_of(row[1:], 1, TAIL // 3) is None


def test_a_drivers_turns_are_one_sequence_of_the_original_prompt(tmp_path):
    """With tools the driver sends each model turn as a request named by `turn_request_id`: the
    next turn (prompt + turn 1 + tool output) takes the row the last turn held and holds the
    same tokens before it, yet it continues the trajectory, not the finished row; it drafts from
    the original prompt's tree and the tool output between the turns is fed as read. Without the
    names (a drop-in speculator) the second turn is a new prompt: the conversation so far."""
    p, turn1, tool, turn2 = [11, 12], [20, 21, 22, EOS], [30, 31, EOS, 32], [40, 41, EOS]

    def run(named: bool, tool_step: bool = True) -> dict:
        names = ["x"]
        store = LmdbSequenceStore.open(tmp_path / f"{named}-{tool_step}")
        d = TreeDrafts(ProposerSettings(None, None, [EOS], adaptive=True, fingerprint=FP), 4, WIDTH - 8,
                       link=StoreLink(store), request_ids=(lambda: names) if named else None)
        ids = np.zeros((1, WIDTH), dtype=np.int64)
        uid = prompt_uid(p, FP)
        for turn, (before, new) in enumerate([(p, turn1), (p + turn1 + tool, turn2)]):
            names[0] = turn_request_id(uid, 0, len(p), turn)
            row = before + new
            ids[0, : len(row)] = row
            d.propose([new], np.array([len(row)]), ids)  # the turn, sampled in one step
            if tool_step:
                d.propose([], np.zeros(0, dtype=np.int64), ids[:0])  # a step while the tool runs
        d.finish()
        with store:
            return stored(store)

    for tool_step in (True, False):
        trees = run(True, tool_step)
        assert trees == {prompt_uid(p, FP): [tuple([p[-1]] + turn1 + tool + turn2)]}  # tool output as read
    assert prompt_uid(p + turn1 + tool, FP) in run(named=False)  # what the names are for


def test_a_turn_request_id_names_its_trajectory_and_prompt():
    rid = turn_request_id("abc", 3, 17, 2)
    assert parse_turn_request(rid) == ("abc:3", 17)
    assert parse_turn_request(rid + "-0f3a") == ("abc:3", 17)  # vLLM may add its own suffix
    assert parse_turn_request("0") is None and parse_turn_request("srt-turn:abc") is None
