"""The suffix tree against the reference token tree (tests/cache_store/reference_tree.py), on
random and adversarial programs: every count, every draft and every draft tree must be identical.

A program adds finished sequences with weights, opens live streams, extends them in chunks
(interleaved), closes them, and checks all counts mid-way. Weights are exact binary fractions
(or small integers) so every sum both implementations compute is exact and they must agree bit
for bit. Workloads lean on what breaks suffix trees: tiny alphabets, period-1 and period-2
strings, long repeats, sequences shorter and longer than the depth bound, many identical
sequences. Deliberately wrong variants, of the tree and of the reference (each breaking one
drafting rule), must be caught by the same search.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_store.suffix_tree import SuffixTree
from tests.cache_store.reference_tree import ReferenceTree
from tests.cache_store.support import first_caught

WEIGHTS = [1.0, 1.0, 0.5, 0.25, 0.75, 2.0, 3.0]


def _alphabet() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, 1), st.integers(0, 3), st.sampled_from([0, 7, 2**31 - 1]))


tok = st.integers(0, 2)
periodic = st.builds(lambda unit, n: (unit * 20)[:n], st.lists(tok, min_size=1, max_size=2), st.integers(0, 30))
repeat = st.builds(lambda base, k, cut: (base * k)[cut:], st.lists(_alphabet(), min_size=1, max_size=6),
                   st.integers(1, 6), st.integers(0, 3))
seqs = st.one_of(st.lists(tok, max_size=20), st.lists(_alphabet(), max_size=12), periodic, repeat)
chunk = st.one_of(st.lists(tok, max_size=5), periodic.map(lambda s: s[:7]))
op = st.one_of(
    st.tuples(st.just("add"), st.tuples(seqs, st.sampled_from(WEIGHTS), st.integers(1, 4))),
    st.tuples(st.just("open"), st.none()),
    st.tuples(st.just("extend"), st.tuples(st.integers(0, 3), chunk)),
    st.tuples(st.just("extend"), st.tuples(st.integers(0, 3), chunk)),
    st.tuples(st.just("close"), st.integers(0, 3)),
    st.tuples(st.just("check"), st.none()),
)
queries = st.lists(st.tuples(st.lists(tok, max_size=10), st.integers(0, 12),
                             st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0])), min_size=1, max_size=6)
program = st.tuples(st.integers(2, 9), st.lists(op, max_size=14), queries)


def counts_disagree(tree, ref: ReferenceTree, extra: list[list[int]]) -> str | None:
    """`tree` counts every path of the reference (the empty one: the mass) as it does, and holds
    no other path over the tokens stored; the queries' heads and tails count the same too."""
    alphabet = sorted({p[0] for p in ref.c})
    for p, c in [((), ref.mass), *ref.c.items()]:
        if tree.count(list(p)) != c:
            return f"count {list(p)}: {tree.count(list(p))} != {c}"
        for x in alphabet if len(p) < ref.d else ():
            if p + (x,) not in ref.c and tree.count([*p, x]) != 0.0:
                return f"count {[*p, x]}: not a path of the reference"
    for p in extra:
        for k in range(len(p) + 1):
            for q in (p[:k], p[k:]):
                if tree.count(q) != ref.count(q):
                    return f"count {q}"
    return None


def streams_disagree(tree, streams, qs) -> str | None:
    """A stream's own drafts (matched from its windows) equal drafts from its tokens."""
    for s, _ in streams:
        ctx = tree.sequence(s.sequence_id).tolist()
        for _, budget, min_prob in qs:
            if s.draft(budget, min_prob) != tree.draft(ctx, budget, min_prob):
                return f"stream draft {ctx} {budget} {min_prob}"
            if s.draft_tree(budget, min_prob) != tree.draft_tree(ctx, budget, min_prob):
                return f"stream draft_tree {ctx} {budget} {min_prob}"
    return None


def run(d, ops, qs, make=SuffixTree, add=None, extend=None, reference=ReferenceTree):
    """Play the program on a tree from `make` and on the reference; None when they agree."""
    tree, ref, streams, tails = make(d), reference(d), [], []
    extra = [q[0] for q in qs]
    for kind, arg in ops:
        if kind == "add":
            seq, w, times = arg
            for _ in range(times):
                (add or (lambda t, s, w: t.add(s, w)))(tree, seq, w)
                ref.add(seq, w)
        elif kind == "open":
            streams.append([tree.stream(), True]), tails.append(ref.stream())
        elif kind == "extend" and streams and streams[arg[0] % len(streams)][1]:
            i = arg[0] % len(streams)
            (extend or (lambda t, s, c: s.extend(c)))(tree, streams[i][0], arg[1])
            ref.extend(tails[i], arg[1])
        elif kind == "close" and streams:
            s = streams[arg % len(streams)]
            s[0].close()
            s[1] = False
        elif kind == "check" and (why := counts_disagree(tree, ref, extra)):
            return "mid-way " + why
    if why := counts_disagree(tree, ref, extra) or drafts_disagree(tree, ref, qs):
        return why
    if why := streams_disagree(tree, streams, qs):
        return why
    for s, _ in streams:
        s.close()
    if why := counts_disagree(tree, ref, extra) or streams_disagree(tree, streams, qs):
        return "after closing: " + why
    if tree.nodes > 2 * tree.stats().tokens:
        return "more than two nodes per token: path compression is broken"
    return None


def drafts_disagree(tree, ref: ReferenceTree, qs) -> str | None:
    for ctx, budget, min_prob in qs:
        got, want = tree.draft(ctx, budget, min_prob), ref.draft(ctx, budget, min_prob)
        if got != want:
            return f"draft {ctx} {budget} {min_prob}: {got} != {want}"
        got, want = tree.draft_tree(ctx, budget, min_prob), ref.draft_tree(ctx, budget, min_prob)
        if got != want:
            return f"draft_tree {ctx} {budget} {min_prob}: {got} != {want}"
    return None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_suffix_tree_agrees_with_the_reference(prog):
    assert run(*prog) is None


# -- deliberately wrong variants: the same search must catch each ---------------------------

def off_by_one_depth(d: int) -> SuffixTree:
    """Bug: windows one token longer than the depth bound."""
    return SuffixTree(d + 1)


def ignore_weight(tree, seq, w):
    """Bug: a finished sequence counts 1 whatever its weight (decay lost)."""
    tree.add(seq, 1.0)


def restart_each_chunk(tree, stream, chunk):
    """Bug: every chunk of a live sequence is inserted as a sequence of its own."""
    if chunk:
        tree.add(chunk)


WRONG = {
    "off_by_one_depth": dict(make=off_by_one_depth),
    "ignore_weight": dict(add=ignore_weight),
    "restart_each_chunk": dict(extend=restart_each_chunk),
}


class CountOverParent(ReferenceTree):
    """Bug: C(v) = count(v) / count(parent) (ignores that some occurrences end at the parent)."""

    def cond(self, p):
        return [(t, c / self.count(p)) for t, c in self.kids(p)]


class ChunkRestart(ReferenceTree):
    """Bug: a stream forgets its context at every chunk boundary."""

    def extend(self, tail, tokens, weight=1.0):
        tail.clear()
        super().extend(tail, tokens, weight)


class NoMatchCap(ReferenceTree):
    """Bug: matches the longest tail up to max_depth - 1, leaving no room to draft."""

    def match(self, ctx, budget):
        return super().match(ctx, 1)  # the cap a budget of one token gets: max_depth - 1


class TiesToLargestToken(ReferenceTree):
    """Bug: among equal counts, prefers the larger token."""

    def kids(self, p):
        return sorted(super().kids(p), key=lambda tc: (-tc[1], -tc[0]))


WRONG.update({cls.__name__: dict(reference=cls)
              for cls in (CountOverParent, ChunkRestart, NoMatchCap, TiesToLargestToken)})


@pytest.mark.parametrize("name", WRONG)
def test_random_programs_catch_wrong_variant(name):
    found = first_caught(program, lambda prog: run(*prog, **WRONG[name]) is not None)
    assert run(*found, **WRONG[name]) is not None
    assert run(*found) is None


# the smallest programs that tell each wrong reference from the tree, kept as regressions
MINIMAL = [
    (CountOverParent, (2, [("add", ([0, 0], 1.0, 1))], [([0], 1, 0.0)])),
    (ChunkRestart, (2, [("open", None), ("extend", (0, [0])), ("extend", (0, [0]))], [([], 0, 0.0)])),
    (NoMatchCap, (4, [("add", ([0, 0, 0, 0], 1.0, 1))], [([0, 0, 0], 2, 0.0)])),
    (TiesToLargestToken, (2, [("add", ([1, 1, 0], 1.0, 1))], [([1], 1, 0.0)])),
]


@pytest.mark.parametrize("variant,prog", MINIMAL, ids=lambda x: getattr(x, "__name__", ""))
def test_minimal_counterexamples(variant, prog):
    assert run(*prog) is None
    assert run(*prog, reference=variant) is not None


# -- targeted workloads ---------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.lists(st.integers(0, 1), min_size=1, max_size=3), st.integers(1, 60),
       st.integers(1, 8), st.integers(1, 7))
def test_interleaved_periodic_streams_match_the_reference_at_every_step(d, unit, n, streams, step):
    """K live copies of a period-1/2 string, fed in lockstep chunks: each window walks the
    others' growing leaves, the hardest case for in-flight counting."""
    seq = (unit * n)[:n]
    tree, ref = SuffixTree(d), ReferenceTree(d)
    ss = [(tree.stream(), ref.stream()) for _ in range(streams)]
    for lo in range(0, n, step):
        for a, tail in ss:
            a.extend(seq[lo:lo + step]), ref.extend(tail, seq[lo:lo + step])
        assert counts_disagree(tree, ref, []) is None
        ctx = seq[:lo + 1]
        assert tree.draft(ctx, 8, 0.0) == ref.draft(ctx, 8, 0.0)
        assert tree.draft_tree(ctx, 8, 0.0) == ref.draft_tree(ctx, 8, 0.0)
        own = seq[:lo + step][-d:]
        assert ss[0][0].draft(8, 0.0) == ref.draft(own, 8, 0.0)
        assert ss[-1][0].draft_tree(8, 0.0) == ref.draft_tree(own, 8, 0.0)


def test_many_identical_long_sequences_share_one_path():
    base = list(range(100))
    tree = SuffixTree(16)
    for _ in range(50):
        tree.add(base)
    assert tree.count(base[:16]) == 50 and tree.count(base[:17]) == 0.0
    assert tree.nodes <= 2 * len(base)  # 50 copies cost no more nodes than one
    assert tree.draft([3], budget=5).tokens == [4, 5, 6, 7, 8]


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.lists(st.integers(0, 4), max_size=60), st.lists(st.integers(0, 60), max_size=6))
def test_streaming_in_any_chunks_equals_adding_whole(d, seq, cuts):
    whole, streamed, ref = SuffixTree(d), SuffixTree(d), ReferenceTree(d)
    whole.add(seq), ref.add(seq)
    s = streamed.stream()
    bounds = sorted({0, len(seq), *[min(c, len(seq)) for c in cuts]})
    for lo, hi in zip(bounds, bounds[1:]):
        s.extend(seq[lo:hi])
    assert counts_disagree(streamed, ref, []) is None
    s.close()
    assert counts_disagree(streamed, ref, []) is None and counts_disagree(whole, ref, []) is None
    assert streamed.draft(seq, 8, 0.0) == whole.draft(seq, 8, 0.0) == ref.draft(seq, 8, 0.0)


def test_bad_input_raises_and_changes_nothing():
    t = SuffixTree(4)
    t.add([1, 2, 3])
    before = (t.nodes, t.mass, t.stats().sequences)
    for bad in ([1, -1], [1, 2**31], [1, 2**70]):
        with pytest.raises(ValueError):
            t.add(bad)
        with pytest.raises(ValueError):
            t.stream().extend(bad)
    with pytest.raises(TypeError):
        t.add([1, "a"])
    with pytest.raises(TypeError):
        t.add(5)
    for w in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            t.add([1], w)
    assert (t.nodes, t.mass) == before[:2]
    s = t.stream()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.extend([1])
    for d in (0, 1, 1025):
        with pytest.raises(ValueError):
            SuffixTree(d)


def test_a_stream_keeps_its_tree_alive_and_reports_itself():
    t = SuffixTree(4)
    s = t.stream()
    del t
    s.extend([1, 2, 3])
    assert len(s) == 3 and s.sequence_id == 0


def test_stats_and_sequences_read_back():
    t = SuffixTree(8)
    a = t.add([5, 6, 7], 0.5)
    s = t.stream()
    s.extend([5, 6])
    st_ = t.stats()
    assert (st_.sequences, st_.live, st_.tokens) == (2, 1, 5)
    assert t.sequence(a).tolist() == [5, 6, 7] and t.sequence(s.sequence_id).tolist() == [5, 6]
    assert t.mass == 0.5 * 3 + 2 and st_.memory_bytes > 0
    s.close()
    assert t.stats().live == 0
