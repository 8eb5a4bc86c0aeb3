"""Row tracking, tree feeding and drafting for the SRT proposer in vLLM's worker (no vLLM import,
so it is tested directly).

After every step vLLM hands over `token_ids_cpu[i, :num_tokens_no_spec[i]]`, the prompt plus
every token row i has kept so far (this step's sampled tokens already written), and wants one
list of draft ids per row. Drafts carry no probabilities, so vLLM verifies them as point masses
(lossless); we always draft the most frequent path (`SuffixTree.draft`), like the embedded
drafter's `--draft-mode greedy`.

The hook passes no request ids, and rows move (vLLM condenses its batch when requests end), so
each row's sequence is recognised by its tokens, reading only what a step changed: a row
continues a sequence it tracked if it is at least as long as the sequence was and holds the
same `TAIL` tokens before that length (one gather for the whole batch; a step costs the new
tokens, not the response length); otherwise it is a sequence that moved there, or a new one,
whose prompt is found by its leading tokens (longest prompt first) in the prompt table. The trees are the
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
from srtcli.rollout.drafters.group_trees import DEPTH, SHARED_DEPTH, Group, GroupTrees
# pick drafts exactly as the embedded drafter does
from srtcli.rollout.drafters.srt import prefer_shared
from srtcli.rollout.vllm.table import Table

# tokens before a row's known length that recognise it (with the length) next step: as many as a
# draft reads, so only rows that end alike as far as a draft looks can be taken for each other
TAIL = DEPTH


@dataclass
class _Seq:
    uid: str
    plen: int
    seen: int  # tokens of the row inserted (or skipped) so far: the row's length last step
    streams: tuple  # the group tree's stream first: it drafts without looking the context up
    group: Group  # its own reference: a retired group's sequence can still draft
    tail: Any = None  # the row's last `TAIL` tokens before `seen` (what recognises the row)
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


def tail_positions(seen: np.ndarray) -> np.ndarray:
    """Per row, the `TAIL` positions just before its `seen` (clipped at 0), to gather at once."""
    return np.maximum(seen[:, None] - TAIL + np.arange(TAIL), 0)


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
        self.tails = np.zeros((0, TAIL), dtype=np.int64)  # each row's `_Seq.tail`, in one array
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
        return _Seq(uid, len(prompt), len(prompt), self.trees.streams(g, prompt[-1]), g)

    @staticmethod
    def _continues(s: _Seq, row: np.ndarray, n: int) -> bool:
        return not s.ended and n >= s.seen and np.array_equal(row[tail_positions(np.array([s.seen]))[0]], s.tail)

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
        """Row -> the sequence it holds now; a tracked sequence no row holds any more is ended."""
        prev, cur = self.rows, {}
        free = {id(s): s for s in prev.values()}
        for i in self._kept(len(sampled_token_ids), num_tokens_no_spec, token_ids_cpu):
            cur[i] = prev[i]  # rows that kept their sequence
            free.pop(id(prev[i]), None)
        for i in range(len(sampled_token_ids)):  # moved rows, then new sequences
            if i in cur or not len(sampled_token_ids[i]):  # still prefilling: nothing sampled yet
                continue
            s = self._arrived(free, token_ids_cpu[i], int(num_tokens_no_spec[i]))
            if s is not None:
                cur[i] = s
        for s in free.values():  # left the batch: finished
            self._end(s)
        return cur

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
        if self.trees.flush_if_due():
            self.c.commits += 1
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
        """Stream the row's new tokens up to and including eos or `max_new_tokens`."""
        left = self.table.max_new_tokens - (s.seen - s.plen)
        keep = new if left >= len(new) else new[:max(left, 0)]
        if not self.eos.isdisjoint(keep):
            keep = keep[: next(j for j, t in enumerate(keep) if t in self.eos) + 1]
        for st in s.streams:
            st.extend(keep)
        capped = s.seen - s.plen + len(keep) >= self.table.max_new_tokens
        if len(keep) < len(new) or (keep and keep[-1] in self.eos) or capped:
            s.done = True

    def _room(self, s: _Seq, n: int) -> int:
        if s.spec_len < 0:
            s.spec_len = self.budget
        return min(s.spec_len, self.max_model_len - n - 1, self.table.max_new_tokens - (n - s.plen) - 1)

    def _draft(self, s: _Seq, row: np.ndarray, n: int) -> list[int]:
        """The most frequent path after the row's last tokens: the group tree's stream holds
        exactly the row's output (anchor first) while it drafts, so it drafts without a lookup."""
        self.c.rows += 1
        room = self._room(s, n)
        if room <= 0:
            return []
        best = s.streams[0].draft(room, self.table.min_prob)
        if self.trees.shared is not None:
            ctx = row[max(s.plen - 1, n - SHARED_DEPTH):n].tolist()
            best = prefer_shared(best, self.trees.shared, ctx, room, self.table.min_prob)
        if best.tokens:
            self.c.drafted_rows += 1
            self.c.drafted_tokens += len(best.tokens)
        return best.tokens

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
        self.rows, self.tails = {}, self.tails[:0]
        for uid in list(self.trees.groups):
            self.trees.retire(uid)
        self.flush()
        self.c.groups, self.c.hits = self.trees.loaded, self.trees.hits
        self.trees.loaded = self.trees.hits = 0
        out = {k: v for k, v in self.c.__dict__.items() if k != "extra"}
        self.c = Counters()
        return out
