"""Token tree semantics on hand-made examples: counts, weights, streams, drafting rules, limits."""

from __future__ import annotations

import random
import threading
from collections import Counter

import numpy as np
import pytest

from cache_store.suffix_tree import Draft, DraftTree, SuffixTree
from tests.cache_store.reference_tree import ReferenceTree


def substrings(seqs, d):
    """Occurrences of every substring of length 1..d (the counts a token tree must hold)."""
    occ = Counter()
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + d) + 1):
                occ[tuple(s[i:j])] += 1
    return occ


def same_counts(a: SuffixTree, b: SuffixTree, paths) -> bool:
    return a.mass == b.mass and all(a.count(p) == b.count(p) for p in paths)


# -- counts --------------------------------------------------------------------------------

def test_counts_are_substring_occurrences_and_parent_is_children_plus_ends():
    rng = random.Random(7)
    d = 5
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(8)]
    t, ref = SuffixTree(d), ReferenceTree(d)
    for s in seqs:
        t.add(s), ref.add(s)
    occ = substrings(seqs, d)
    assert ref.c == occ  # the reference itself holds exactly the substrings
    assert t.mass == sum(len(s) for s in seqs)
    for p, n in occ.items():
        assert t.count(p) == n
        if len(p) < d:  # below max depth: count = sum of children + sequences ending here
            kids = sum(t.count(p + (x,)) for x in range(4))
            ends = sum(1 for s in seqs if tuple(s[len(s) - len(p):]) == p)
            assert t.count(p) == kids + ends
    assert t.count([3, 3, 3, 3, 3, 3]) == 0.0  # longer than max_depth
    assert t.count([]) == t.mass


def test_max_depth_is_respected():
    t = SuffixTree(3)
    t.add([1, 2, 3, 4, 5])
    assert t.count([1, 2, 3]) == 1.0 and t.count([3, 4, 5]) == 1.0
    assert t.count([1, 2, 3, 4]) == 0.0
    assert t.max_depth == 3
    for bad in (0, 1, 1025, -3):
        with pytest.raises(ValueError):
            SuffixTree(bad)


def test_weights_scale_counts_and_drafts_follow_the_weighted_counts():
    t = SuffixTree(8)
    t.add([1, 2, 3], 0.5)
    t.add([1, 2, 3], 0.5)
    t.add([1, 2], 0.5)
    assert t.count([1, 2]) == 1.5 and t.count([1, 2, 3]) == 1.0 and t.mass == 4.0
    t.add([1, 2, 4], 1.5)  # one heavier sequence outweighs two lighter ones
    assert t.draft([1, 2], min_prob=0.0) == Draft([4], [0.6], 2)
    assert t.count([2, 4]) == 1.5 and t.count([2]) == 3.0


def test_stream_chunks_and_interleaved_streams_equal_whole_adds():
    rng = random.Random(1)
    seqs = [[rng.randrange(6) for _ in range(50)] for _ in range(3)]
    whole = SuffixTree(8)
    for s in seqs:
        whole.add(s)
    t = SuffixTree(8)
    streams = [t.stream() for _ in seqs]
    pos = [0] * len(seqs)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        i = rng.randrange(len(seqs))
        k = rng.randrange(0, 7)
        streams[i].extend(seqs[i][pos[i]:pos[i] + k])
        pos[i] += k
    assert same_counts(t, whole, substrings(seqs, 8))
    for s in seqs:
        assert t.draft(s[:20], min_prob=0.0) == whole.draft(s[:20], min_prob=0.0)


def test_numpy_and_other_iterables_are_accepted():
    a, b = SuffixTree(4), SuffixTree(4)
    a.add(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    b.add(iter([1, 2, 3, 1, 2]))
    assert same_counts(a, b, substrings([[1, 2, 3, 1, 2]], 4))
    assert a.draft(np.array([5, 1], dtype=np.int32)).tokens == [2, 3, 1]
    assert a.draft((1,)).tokens == [2, 3, 1]


# -- drafting ------------------------------------------------------------------------------

def test_draft_follows_longest_match_then_highest_c():
    t = SuffixTree(16)
    t.add([1, 2, 3, 4, 4])
    t.add([9, 2, 3, 5, 6])
    assert t.draft([1, 2, 3]) == Draft([4, 4], [1.0, 1.0], 3)
    # [7, 2, 3] matches only [2, 3]: children 4 and 5 tie (count 1), the lower token wins
    assert t.draft([7, 2, 3]) == Draft([4, 4], [0.5, 1.0], 2)


def test_c_divides_by_the_children_not_by_the_parent():
    t = SuffixTree(8)
    for s in ([1, 2], [1, 3, 4], [1]):  # [1] occurs 3 times, once as an end
        t.add(s)
    d = t.draft([1], min_prob=0.0)
    assert d.tokens[0] == 2 and d.probs[0] == 0.5


def test_greedy_threshold_and_budget():
    t = SuffixTree(8)
    t.add([5, 1, 2])
    t.add([5, 1, 3])
    t.add([5, 1, 3])
    assert t.draft([5]) == Draft([1, 3], [1.0, 2 / 3], 1)
    assert t.draft([5], min_prob=0.7) == Draft([1], [1.0], 1)  # path score 2/3 < 0.7 stops
    assert t.draft([5], budget=1) == Draft([1], [1.0], 1)
    assert t.draft([5], budget=0) == Draft([], [], 1)
    long = SuffixTree(64)
    long.add(list(range(100)))
    assert long.draft([0], budget=16).tokens == list(range(1, 17))


def test_empty_draft_when_nothing_matches():
    t = SuffixTree(8)
    assert t.draft([1, 2]) == Draft([], [], 0)
    t.add([1, 2])
    assert t.draft([42]) == Draft([], [], 0)
    assert t.draft([]) == Draft([], [], 0)
    assert t.draft([2]) == Draft([], [], 0)  # [2] only ever ended a sequence
    assert t.draft_tree([42]) == DraftTree([], [], [], 0)


def test_match_falls_back_to_a_shorter_tail_with_children():
    t = SuffixTree(16)
    t.add([1, 2, 3])
    t.add([3, 4])
    # [1, 2, 3] and [2, 3] only end sequences; [3] continues with 4
    assert t.draft([1, 2, 3]) == Draft([4], [1.0], 1)


def test_match_is_capped_to_leave_room_for_the_draft():
    t = SuffixTree(8)
    t.add(list(range(20)))
    # cap = max_depth - min(budget, max_depth // 2) = 8 - 4: four tokens of context, four of draft
    d = t.draft(list(range(10)), budget=16)
    assert d.match_len == 4 and d.tokens == [10, 11, 12, 13]
    d = t.draft(list(range(10)), budget=2)  # cap = 8 - 2
    assert d.match_len == 6 and d.tokens == [10, 11]


def test_draft_tree_is_best_first():
    t = SuffixTree(64)
    for s, k in (([0, 1, 2], 3), ([0, 1, 3], 1), ([0, 4], 2)):
        for _ in range(k):
            t.add(s)
    dt = t.draft_tree([0], budget=16, min_prob=0.1)
    assert dt == DraftTree([1, 2, 4, 3], [-1, 0, -1, 0], [4 / 6, 3 / 4, 2 / 6, 1 / 4], 1)
    # a smaller budget takes a prefix of the same order; the threshold cuts low path scores
    assert t.draft_tree([0], budget=2) == DraftTree([1, 2], [-1, 0], [4 / 6, 3 / 4], 1)
    assert t.draft_tree([0], min_prob=0.3).tokens == [1, 2, 4]


def test_draft_tree_ties_go_to_the_node_found_first():
    t = SuffixTree(8)
    for s in ([0, 1, 5], [0, 1, 6], [0, 2, 7], [0, 2, 8]):
        t.add(s)
    # every path score ties at each depth: children in token order, depth by depth
    assert t.draft_tree([0], min_prob=0.0) == DraftTree([1, 2, 5, 6, 7, 8], [-1, -1, 0, 0, 1, 1],
                                                        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5], 1)


def test_draft_tree_order_on_random_trees():
    rng = random.Random(3)
    for _ in range(30):
        t = SuffixTree(12)
        base = [rng.randrange(5) for _ in range(60)]
        for _ in range(6):
            t.add([x if rng.random() > 0.2 else rng.randrange(5) for x in base])
        ctx = base[: rng.randrange(1, 20)]
        dt = t.draft_tree(ctx, budget=24, min_prob=0.01)
        scores = []
        for i, (p, c) in enumerate(zip(dt.parents, dt.probs)):
            assert -1 <= p < i
            scores.append(c * (scores[p] if p >= 0 else 1.0))
        assert scores == sorted(scores, reverse=True)
        assert all(s >= 0.01 for s in scores) and len(dt.tokens) <= 24
        greedy = t.draft(ctx, budget=24, min_prob=0.01)
        assert dt.tokens[:1] == greedy.tokens[:1] and dt.match_len == greedy.match_len


# -- scale of use ---------------------------------------------------------------------------

def test_large_vocab_and_many_tokens_count_correctly():
    rng = random.Random(5)
    seqs = [[rng.randrange(50_000) for _ in range(3000)] for _ in range(4)]
    seqs.append(seqs[0][100:900])  # a repeated stretch
    t = SuffixTree(6)
    for s in seqs:
        t.add(s)
    occ = substrings(seqs, 6)
    for p in rng.sample(sorted(occ), 500):
        assert t.count(p) == occ[p]
    # match capped at 6 - 3 tokens, leaving 3 of room below it
    d = t.draft(seqs[0][:150], budget=16, min_prob=0.0)
    assert d.tokens == seqs[0][150:153] and d.match_len == 3
    assert t.nodes <= 2 * t.tokens


def test_threads_sharing_a_tree_see_whole_operations():
    # every call holds the GIL; interleaved streams from threads must equal the same adds
    rng = random.Random(9)
    seqs = [[rng.randrange(8) for _ in range(400)] for _ in range(4)]
    t = SuffixTree(10)

    def work(seq):
        s = t.stream()
        for i in range(0, len(seq), 3):
            s.extend(seq[i:i + 3])
            t.draft(seq[:i + 1], budget=8)
            t.draft_tree(seq[:i + 1], budget=8)

    threads = [threading.Thread(target=work, args=(s,)) for s in seqs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    whole = SuffixTree(10)
    for s in seqs:
        whole.add(s)
    assert same_counts(t, whole, substrings(seqs, 10))
