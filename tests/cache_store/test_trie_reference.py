"""The compiled token tree against a tiny pure-Python reference, on random programs of operations.

The reference keeps the tree as a dict path -> count and implements each rule of docs/cache.md
("The tree") in the most direct way (linear scans, recomputed sums). Counts stay dyadic rationals
(integer inserts, factors like 0.5 or 0.75), so every float the two compute is exact and drafts
must agree bit for bit. Buggy variants of the reference must be told apart by the same harness.
"""

from __future__ import annotations

import heapq
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_store.trie import TokenTree
from tests.cache_store.support import first_caught


class Ref:
    """A suffix trie of depth d as a dict {path tuple: count}."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.c: dict[tuple, float] = {}
        self.epoch = 0

    # building: a stream bumps the suffixes of lengths 0..m of its history, then extends m
    def stream(self) -> dict:
        return {"hist": [], "m": 0, "epoch": self.epoch}

    def extend(self, s: dict, tokens: list[int]) -> None:
        if s["epoch"] != self.epoch:  # nodes were dropped: keep the contexts still present
            m = 0
            for L in range(1, len(s["hist"]) + 1):
                if tuple(s["hist"][-L:]) not in self.c:
                    break
                m = L
            s["m"], s["epoch"] = m, self.epoch
        for t in tokens:
            h = s["hist"]
            for k in range(s["m"] + 1):
                p = tuple(h[len(h) - k:]) + (t,)
                self.c[p] = self.c.get(p, 0.0) + 1.0
            h.append(t)
            del h[: max(0, len(h) - (self.d - 1))]
            s["m"] = min(s["m"] + 1, self.d - 1)

    def insert(self, tokens: list[int]) -> None:
        self.extend(self.stream(), tokens)

    def kids(self, p: tuple) -> list[tuple[int, float]]:
        """Children as (token, count), best first: count descending, then token ascending."""
        out = [(q[-1], c) for q, c in self.c.items() if len(q) == len(p) + 1 and q[:-1] == p]
        return sorted(out, key=lambda tc: (-tc[1], tc[0]))

    def match(self, ctx: list[int], budget: int) -> tuple | None:
        cap = self.d - max(1, min(budget, self.d // 2))
        for k in range(min(cap, len(ctx)), 0, -1):
            p = tuple(ctx[len(ctx) - k:])
            if p in self.c and self.kids(p):
                return p
        return None

    def cond(self, p: tuple) -> list[tuple[int, float]]:
        kids = self.kids(p)
        total = sum(c for _, c in kids)
        return [(t, c / total) for t, c in kids]

    def draft(self, ctx, budget, min_prob):
        p = self.match(ctx, budget)
        if p is None:
            return [], [], 0
        toks, probs, score = [], [], 1.0
        while len(toks) < budget and self.kids(p):
            t, c = self.cond(p)[0]
            score *= c
            if score < min_prob:
                break
            toks.append(t)
            probs.append(c)
            p = p + (t,)
        return toks, probs, len(self.match(ctx, budget))

    def draft_tree(self, ctx, budget, min_prob):
        p0 = self.match(ctx, budget)
        if p0 is None:
            return [], [], [], 0
        heap, seq, out = [], 0, ([], [], [])
        for t, c in self.cond(p0):
            heapq.heappush(heap, (-c, seq, p0 + (t,), -1, c))
            seq += 1
        while heap and len(out[0]) < budget:
            negs, _, p, parent, c = heapq.heappop(heap)
            if -negs < min_prob:
                break
            out[0].append(p[-1]), out[1].append(parent), out[2].append(c)
            for t, c2 in self.cond(p):
                heapq.heappush(heap, (negs * c2, seq, p + (t,), len(out[0]) - 1, c2))
                seq += 1
        return out[0], out[1], out[2], len(p0)

    def scale(self, factor: float, floor: float) -> None:
        for p in self.c:
            self.c[p] *= factor
        kept: dict[tuple, float] = {}
        for p in sorted(self.c, key=len):
            if self.c[p] >= floor and self.c[p] > 0 and (len(p) == 1 or p[:-1] in kept):
                kept[p] = self.c[p]
        if len(kept) != len(self.c):
            self.epoch += 1
        self.c = kept

    def merge(self, other: "Ref") -> None:
        for p, c in list(other.c.items()):
            self.c[p] = self.c.get(p, 0.0) + c


def tree_paths(tree: TokenTree) -> dict[tuple, float]:
    """Every (path, count) of a compiled tree, read back from its bytes."""
    b = tree.to_bytes()
    n = struct.unpack_from("<I", b, 12)[0]
    parents = struct.unpack_from(f"<{n}I", b, 16)
    tokens = struct.unpack_from(f"<{n}I", b, 16 + 4 * n)
    counts = struct.unpack_from(f"<{n}d", b, 16 + 8 * n)
    paths: list[tuple] = [()]
    out = {}
    for i in range(n):
        p = paths[parents[i]] + (tokens[i],)
        paths.append(p)
        out[p] = counts[i]
    return out


# A program: build ops on tree 0, sometimes via a second tree merged in, then queries.
token = st.integers(0, 4)
seqs = st.lists(token, max_size=24)
extend = st.tuples(st.just("extend"), st.tuples(st.integers(0, 3), seqs))
op = st.one_of(
    st.tuples(st.just("insert"), seqs),
    st.tuples(st.just("open"), st.just(None)),
    extend, extend,
    st.tuples(st.just("scale"), st.tuples(st.sampled_from([0.5, 0.75, 1.0, 2.0, 0.25]),
                                          st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.5, 3.0]))),
    st.tuples(st.just("merge"), st.lists(seqs, max_size=3)),
    st.tuples(st.just("merge_self"), st.just(None)),
)
queries = st.lists(st.tuples(st.lists(token, max_size=10), st.integers(0, 12),
                             st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0])), min_size=1, max_size=8)


def run_program(d, ops, ref_cls=Ref):
    ref, tree = ref_cls(d), TokenTree(d)
    rs, ts = [], []
    for kind, arg in ops:
        if kind == "insert":
            ref.insert(arg), tree.insert(arg)
        elif kind == "open":
            rs.append(ref.stream()), ts.append(tree.stream())
        elif kind == "extend" and rs:
            i = arg[0] % len(rs)
            ref.extend(rs[i], arg[1]), ts[i].extend(arg[1])
        elif kind == "scale":
            ref.scale(*arg), tree.scale(*arg)
        elif kind == "merge":
            r2, t2 = ref_cls(d), TokenTree(d)
            for s in arg:
                r2.insert(s), t2.insert(s)
            ref.merge(r2), tree.merge(t2)
        elif kind == "merge_self":
            ref.merge(ref), tree.merge(tree)
    return ref, tree


def disagreement(d, ops, qs, ref_cls=Ref) -> str | None:
    """None when the compiled tree and the reference agree on everything observable."""
    ref, tree = run_program(d, ops, ref_cls)
    if tree_paths(tree) != ref.c:
        return "counts"
    if tree.nodes != len(ref.c) or tree.mass != sum(c for p, c in ref.c.items() if len(p) == 1):
        return "nodes/mass"
    for ctx, budget, min_prob in qs:
        dr = tree.draft(ctx, budget, min_prob)
        if (dr.tokens, dr.probs, dr.match_len) != ref.draft(ctx, budget, min_prob):
            return f"draft {ctx} {budget} {min_prob}"
        dt = tree.draft_tree(ctx, budget, min_prob)
        if (dt.tokens, dt.parents, dt.probs, dt.match_len) != ref.draft_tree(ctx, budget, min_prob):
            return f"draft_tree {ctx} {budget} {min_prob}"
        if tree.count(ctx) != (ref.c.get(tuple(ctx), 0.0) if ctx else tree.mass):
            return "count"
    if TokenTree.from_bytes(tree.to_bytes()).to_bytes() != tree.to_bytes():
        return "bytes"
    return None


program = st.tuples(st.integers(2, 7), st.lists(op, max_size=12), queries)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_compiled_tree_agrees_with_reference(prog):
    d, ops, qs = prog
    assert disagreement(d, ops, qs) is None


# -- deliberately wrong variants: the harness above must catch each ------------------------

class RefCOverParent(Ref):
    """Bug: C(v) = count(v) / count(parent) (ignores that some occurrences end at the parent)."""

    def cond(self, p):
        total = sum(c for q, c in self.c.items() if len(q) == 1) if not p else self.c[p]
        return [(t, c / total) for t, c in self.kids(p)]


class RefChunkRestart(Ref):
    """Bug: a stream forgets its context at every chunk boundary."""

    def extend(self, s, tokens):
        s["hist"], s["m"] = [], 0
        super().extend(s, tokens)


class RefNoMatchCap(Ref):
    """Bug: matches the longest tail up to max_depth - 1, leaving no room to draft."""

    def match(self, ctx, budget):
        for k in range(min(self.d - 1, len(ctx)), 0, -1):
            p = tuple(ctx[len(ctx) - k:])
            if p in self.c and self.kids(p):
                return p
        return None


class RefTieByLargestToken(Ref):
    """Bug: among equal counts, prefers the larger token."""

    def kids(self, p):
        out = [(q[-1], c) for q, c in self.c.items() if len(q) == len(p) + 1 and q[:-1] == p]
        return sorted(out, key=lambda tc: (-tc[1], -tc[0]))


WRONG = [RefCOverParent, RefChunkRestart, RefNoMatchCap, RefTieByLargestToken]


@pytest.mark.parametrize("variant", WRONG, ids=lambda v: v.__name__)
def test_random_programs_catch_wrong_variant(variant):
    # the same random search as the main test, without shrinking, must hit a disagreement
    found = first_caught(program, lambda prog: disagreement(*prog, ref_cls=variant) is not None)
    assert disagreement(*found, ref_cls=variant) is not None
    assert disagreement(*found) is None  # the compiled tree itself agrees with the true reference


# the minimal counterexamples hypothesis found for each variant, kept as regressions
MINIMAL = [
    (RefCOverParent, (2, [("insert", [0, 0])], [([0], 1, 0.0)])),
    (RefChunkRestart, (2, [("open", None), ("extend", (0, [0])), ("extend", (0, [0]))], [([], 0, 0.0)])),
    (RefNoMatchCap, (4, [("insert", [0, 0, 0, 0])], [([0, 0, 0], 2, 0.0)])),
    (RefTieByLargestToken, (2, [("insert", [1, 1, 0])], [([1], 1, 0.0)])),
]


@pytest.mark.parametrize("variant,prog", MINIMAL, ids=lambda x: getattr(x, "__name__", ""))
def test_minimal_counterexamples(variant, prog):
    assert disagreement(*prog) is None
    assert disagreement(*prog, ref_cls=variant) is not None


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6), st.lists(seqs, min_size=1, max_size=4), st.lists(seqs, max_size=4))
def test_merge_equals_inserting_both(d, a_seqs, b_seqs):
    a, b, both = TokenTree(d), TokenTree(d), TokenTree(d)
    for s in a_seqs:
        a.insert(s), both.insert(s)
    for s in b_seqs:
        b.insert(s), both.insert(s)
    a.merge(b)
    assert a.to_bytes() == both.to_bytes()


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.lists(token, max_size=60), st.lists(st.integers(0, 60), max_size=6))
def test_streaming_chunks_equals_inserting_whole(d, seq, cuts):
    whole, streamed = TokenTree(d), TokenTree(d)
    whole.insert(seq)
    s = streamed.stream()
    bounds = sorted({0, len(seq), *[min(c, len(seq)) for c in cuts]})
    for lo, hi in zip(bounds, bounds[1:]):
        s.extend(seq[lo:hi])
    assert streamed.to_bytes() == whole.to_bytes()


# Streams left open across a decay that drops nodes must re-find their contexts (the rarest path
# of the compiled core): open streams first, then interleave extends with dropping scales.
stream_op = st.one_of(
    extend,
    st.tuples(st.just("scale"), st.tuples(st.sampled_from([0.5, 0.75]), st.sampled_from([0.5, 1.0, 1.5]))),
    st.tuples(st.just("insert"), seqs),
)
stream_program = st.tuples(
    st.integers(2, 7),
    st.lists(stream_op, min_size=3, max_size=12).map(lambda ops: [("open", None)] * 3 + ops),
    queries,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream_program)
def test_streams_across_decay_agree_with_reference(prog):
    assert disagreement(*prog) is None


class RefNoResync(Ref):
    """Bug: after nodes were dropped a stream keeps extending its old contexts as if present."""

    def extend(self, s, tokens):
        s["epoch"] = self.epoch
        super().extend(s, tokens)


def test_stream_program_catches_missing_resync():
    found = first_caught(stream_program, lambda prog: disagreement(*prog, ref_cls=RefNoResync) is not None)
    assert disagreement(*found) is None
