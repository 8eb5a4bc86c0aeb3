"""The reference token tree: the drafting rules of docs/cache.md ("Drafting") written out in
plain Python, the oracle the compiled suffix tree (cache_store.suffix_tree) is tested against.

It keeps the tree as a dict {path tuple: count} over every substring of length <= d of the
stored sequences, and implements each rule in the most direct way (linear scans, recomputed
sums). With weights that are exact binary fractions every float it computes is exact, so the
compiled tree must agree with it bit for bit. Subclasses that break one rule on purpose show
that a test would notice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from cache_store.suffix_tree import Draft, DraftTree


class ReferenceTree:
    """Weighted token sequences as a dict {path: weighted occurrences}, paths of length <= d."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.c: dict[tuple, float] = {}

    # building: every token adds its sequence's weight to each substring ending at it
    def stream(self) -> list[int]:
        """A live sequence of weight 1: the handle `extend` takes (its last d tokens)."""
        return []

    def extend(self, tail: list[int], tokens: Iterable[int], weight: float = 1.0) -> None:
        for t in tokens:
            tail.append(t)
            del tail[:-self.d]
            for k in range(1, len(tail) + 1):
                p = tuple(tail[len(tail) - k:])
                self.c[p] = self.c.get(p, 0.0) + weight

    def add(self, tokens: Iterable[int], weight: float = 1.0) -> None:
        self.extend(self.stream(), tokens, weight)

    # queries
    @property
    def mass(self) -> float:
        return sum(c for p, c in self.c.items() if len(p) == 1)

    def count(self, path: Sequence[int]) -> float:
        return self.c.get(tuple(path), 0.0) if path else self.mass

    def kids(self, p: tuple) -> list[tuple[int, float]]:
        """Children as (token, count), best first: count descending, then token ascending."""
        out = [(q[-1], c) for q, c in self.c.items() if len(q) == len(p) + 1 and q[:-1] == p]
        return sorted(out, key=lambda tc: (-tc[1], tc[0]))

    def match(self, ctx: Sequence[int], budget: int) -> tuple | None:
        """The longest tail of `ctx` with children, at most d - min(budget, d // 2) long (>= 1
        below d) so that the draft has room below it."""
        cap = self.d - max(1, min(budget, self.d // 2))
        for k in range(min(cap, len(ctx)), 0, -1):
            p = tuple(ctx[len(ctx) - k:])
            if p in self.c and self.kids(p):
                return p
        return None

    def cond(self, p: tuple) -> list[tuple[int, float]]:
        """Children as (token, C): count over the children's total, not over count(p)."""
        kids = self.kids(p)
        total = sum(c for _, c in kids)
        return [(t, c / total) for t, c in kids]

    def draft(self, ctx: Sequence[int], budget: int = 16, min_prob: float = 0.1) -> Draft:
        p = self.match(ctx, budget)
        if p is None:
            return Draft([], [], 0)
        match_len, toks, probs, score = len(p), [], [], 1.0
        while len(toks) < budget and self.kids(p):
            t, c = self.cond(p)[0]
            score *= c
            if score < min_prob:
                break
            toks.append(t)
            probs.append(c)
            p = p + (t,)
        return Draft(toks, probs, match_len)

    def draft_tree(self, ctx: Sequence[int], budget: int = 16, min_prob: float = 0.1) -> DraftTree:
        p0 = self.match(ctx, budget)
        if p0 is None:
            return DraftTree([], [], [], 0)
        heap, seq, out = [], 0, DraftTree([], [], [], len(p0))
        for t, c in self.cond(p0):  # ties in path score: the node pushed first
            heapq.heappush(heap, (-c, seq, p0 + (t,), -1, c))
            seq += 1
        while heap and len(out.tokens) < budget:
            negs, _, p, parent, c = heapq.heappop(heap)
            if -negs < min_prob:
                break
            out.tokens.append(p[-1]), out.parents.append(parent), out.probs.append(c)
            for t, c2 in self.cond(p):
                heapq.heappush(heap, (negs * c2, seq, p + (t,), len(out.tokens) - 1, c2))
                seq += 1
        return out


def expected_length(probs: Sequence[float]) -> float:
    """A draft's expected accepted length if each token's C were its chance: the sum of the path
    probabilities of its prefixes."""
    total, path = 0.0, 1.0
    for c in probs:
        path *= c
        total += path
    return total


def best_draft(streams: tuple, budget: int, min_prob: float) -> tuple:
    """The stream-choice rule in Python (`cache_store.suffix_tree.pick_stream` is the product's):
    the stream whose greedy draft expects to be accepted for longest, the first on ties, and
    that draft."""
    own, best = streams[0], streams[0].draft(budget, min_prob)
    for other in streams[1:]:
        d = other.draft(budget, min_prob)
        if expected_length(d.probs) > expected_length(best.probs):
            own, best = other, d
    return own, best
