"""The suffix tree against today's token trie and the pure-Python reference, on random and
adversarial programs: every count, every draft and every draft tree must be identical.

A program adds finished sequences with weights, opens live streams, extends them in chunks
(interleaved), closes them, and checks all counts mid-way. Weights are exact binary fractions
(or small integers) so every sum the three implementations compute is exact and they must
agree bit for bit. Workloads lean on what breaks suffix trees: tiny alphabets, period-1 and
period-2 strings, long repeats, sequences shorter and longer than the depth bound, many
identical sequences. Deliberately wrong variants of the tree must be caught by the same search.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_store.suffix_tree import SuffixTree
from cache_store.trie import TokenTree
from tests.cache_store.support import first_caught
from tests.cache_store.test_trie_reference import Ref, tree_paths

WEIGHTS = [1.0, 1.0, 0.5, 0.25, 0.75, 2.0, 3.0]


class Twin:
    """Today's trie and the Python reference fed the same operations (the expected side)."""

    def __init__(self, d: int) -> None:
        self.d, self.old, self.ref = d, TokenTree(d), Ref(d)
        self.streams: list = []

    def add(self, seq: list[int], w: float) -> None:
        t, r = TokenTree(self.d), Ref(self.d)
        t.insert(seq), r.insert(seq)
        if w != 1.0:
            t.scale(w), r.scale(w, 0.0)
        self.old.merge(t), self.ref.merge(r)

    def stream(self) -> None:
        self.streams.append((self.old.stream(), self.ref.stream()))

    def extend(self, i: int, chunk: list[int]) -> None:
        s, r = self.streams[i]
        s.extend(chunk), self.ref.extend(r, chunk)


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


def counts_disagree(tree, twin: Twin, extra: list[list[int]]) -> str | None:
    want = tree_paths(twin.old)
    if want != twin.ref.c:
        return "reference and trie disagree"  # the harness itself would be wrong
    for p, c in want.items():
        if tree.count(list(p)) != c:
            return f"count {list(p)}: {tree.count(list(p))} != {c}"
    for p in extra:
        for k in range(len(p) + 1):
            for q in (p[:k], p[k:]):
                if tree.count(q) != (twin.old.count(q) if len(q) <= twin.d else 0.0):
                    return f"count {q}"
    if tree.mass != twin.old.mass:
        return "mass"
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


def run(d, ops, qs, make=SuffixTree, add=None, extend=None):
    """Play the program on a tree from `make` and on the twin; None when they agree."""
    tree, twin, streams = make(d), Twin(d), []
    extra = [q[0] for q in qs]
    for kind, arg in ops:
        if kind == "add":
            seq, w, times = arg
            for _ in range(times):
                (add or (lambda t, s, w: t.add(s, w)))(tree, seq, w)
                twin.add(seq, w)
        elif kind == "open":
            streams.append([tree.stream(), True]), twin.stream()
        elif kind == "extend" and streams and streams[arg[0] % len(streams)][1]:
            i = arg[0] % len(streams)
            (extend or (lambda t, s, c: s.extend(c)))(tree, streams[i][0], arg[1])
            twin.extend(i, arg[1])
        elif kind == "close" and streams:
            s = streams[arg % len(streams)]
            s[0].close()
            s[1] = False
        elif kind == "check" and (why := counts_disagree(tree, twin, extra)):
            return "mid-way " + why
    if why := counts_disagree(tree, twin, extra):
        return why
    for ctx, budget, min_prob in qs:
        got, want = tree.draft(ctx, budget, min_prob), twin.old.draft(ctx, budget, min_prob)
        if got != want or (want.tokens, want.probs, want.match_len) != twin.ref.draft(ctx, budget, min_prob):
            return f"draft {ctx} {budget} {min_prob}: {got} != {want}"
        got, want = tree.draft_tree(ctx, budget, min_prob), twin.old.draft_tree(ctx, budget, min_prob)
        if got != want or (want.tokens, want.parents, want.probs, want.match_len) != twin.ref.draft_tree(
                ctx, budget, min_prob):
            return f"draft_tree {ctx} {budget} {min_prob}: {got} != {want}"
    if why := streams_disagree(tree, streams, qs):
        return why
    for s, _ in streams:
        s.close()
    if why := counts_disagree(tree, twin, extra) or streams_disagree(tree, streams, qs):
        return "after closing: " + why
    if tree.nodes > 2 * tree.stats().tokens:
        return "more than two nodes per token: path compression is broken"
    return None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_suffix_tree_agrees_with_trie_and_reference(prog):
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


@pytest.mark.parametrize("name", WRONG)
def test_random_programs_catch_wrong_variant(name):
    found = first_caught(program, lambda prog: run(*prog, **WRONG[name]) is not None)
    assert run(*found, **WRONG[name]) is not None
    assert run(*found) is None


# -- targeted workloads ---------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.lists(st.integers(0, 1), min_size=1, max_size=3), st.integers(1, 60),
       st.integers(1, 8), st.integers(1, 7))
def test_interleaved_periodic_streams_match_the_trie_at_every_step(d, unit, n, streams, step):
    """K live copies of a period-1/2 string, fed in lockstep chunks: each window walks the
    others' growing leaves, the hardest case for in-flight counting."""
    seq = (unit * n)[:n]
    tree, old = SuffixTree(d), TokenTree(d)
    ss = [(tree.stream(), old.stream()) for _ in range(streams)]
    for lo in range(0, n, step):
        for a, b in ss:
            a.extend(seq[lo:lo + step]), b.extend(seq[lo:lo + step])
        for p, c in tree_paths(old).items():
            assert tree.count(list(p)) == c
        ctx = seq[:lo + 1]
        assert tree.draft(ctx, 8, 0.0) == old.draft(ctx, 8, 0.0)
        assert tree.draft_tree(ctx, 8, 0.0) == old.draft_tree(ctx, 8, 0.0)
        own = seq[:lo + step][-d:]
        assert ss[0][0].draft(8, 0.0) == old.draft(own, 8, 0.0)
        assert ss[-1][0].draft_tree(8, 0.0) == old.draft_tree(own, 8, 0.0)


def test_many_identical_long_sequences_share_one_path():
    base = list(range(100))
    tree = SuffixTree(16)
    for _ in range(50):
        tree.add(base)
    assert tree.count(base[:16]) == 50 and tree.count(base[:17]) == 0.0
    assert tree.nodes <= 2 * len(base)  # 50 copies cost no more nodes than one
    assert tree.draft([3], budget=5).tokens == [4, 5, 6, 7, 8]


def test_streaming_in_any_chunks_equals_adding_whole():
    seq = [1, 2, 1, 2, 3, 1, 2, 1, 2, 3, 3, 1] * 4
    whole = SuffixTree(6)
    whole.add(seq)
    for step in (1, 2, 5, 48):
        t = SuffixTree(6)
        s = t.stream()
        for lo in range(0, len(seq), step):
            s.extend(seq[lo:lo + step])
        s.close()
        for p, c in tree_paths_of(seq, 6).items():
            assert t.count(p) == whole.count(p) == c


def tree_paths_of(seq, d):
    old = TokenTree(d)
    old.insert(seq)
    return {tuple(p): c for p, c in tree_paths(old).items()}


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
