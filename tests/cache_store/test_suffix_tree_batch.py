"""`feed_many` and `draft_many`, the calls that feed and draft many live streams at once, do
what feeding and drafting each stream from Python does: the same tokens appended (cut at the
limit and after the first eos), the same accepted counts, the same draft picked between a
row's streams, on one thread or several; and bad arguments are refused before a row is
touched."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cache_store.suffix_tree import SuffixTree, best_draft as picked_draft, draft_many, feed_many, pick_stream
from tests.cache_store.reference_tree import best_draft, expected_length

EOS = 1


def rows_of(pairs):
    return [tuple(s.core for s in pair) for pair in pairs]


@pytest.mark.parametrize("dtype,threads", [(np.int32, 1), (np.int64, 1), (np.int64, 3)])
def test_batched_calls_equal_one_stream_at_a_time(dtype, threads):
    rng = random.Random(0)
    for _ in range(60):
        own, shared = SuffixTree(64), SuffixTree(24)
        vocab, rows = rng.choice([3, 5, 20]), rng.randint(1, 6)
        batched = [(own.stream(), shared.stream()) for _ in range(rows)]
        one_by_one = [(own.stream(), shared.stream()) for _ in range(rows)]  # same trees, same tokens
        ids = np.zeros((rows, 300), dtype=dtype)
        n = np.zeros(rows, dtype=np.int64)
        for _ in range(40):
            seen = n.copy()
            for i in range(rows):
                k = rng.randint(0, 4)
                ids[i, n[i]:n[i] + k] = [rng.randrange(vocab) for _ in range(k)]
                n[i] += k
            drafts = [[rng.randrange(vocab) for _ in range(rng.randint(0, 3))] for _ in range(rows)]
            limits = seen + np.array([rng.randint(0, 5) for _ in range(rows)])
            fed, accepted = feed_many(rows_of(batched), ids, np.arange(rows), seen, n, limits,
                                      np.array([EOS]), drafts, threads)
            for i in range(rows):
                new = ids[i, seen[i]:n[i]].tolist()
                keep = new[:max(0, min(len(new), limits[i] - seen[i]))]
                if EOS in keep:
                    keep = keep[:keep.index(EOS) + 1]
                for s in one_by_one[i]:
                    s.extend(keep)
                a = 0
                while a < min(len(new), len(drafts[i])) and new[a] == drafts[i][a]:
                    a += 1
                assert (fed[i], accepted[i]) == (len(keep), a)
            rooms = np.array([rng.randint(-1, 8) for _ in range(rows)])
            want = [best_draft(one_by_one[i], int(r), 0.1)[1].tokens if r > 0 else [] for i, r in enumerate(rooms)]
            assert draft_many(rows_of(batched), rooms, 0.1, threads) == want


def _last_on_ties(streams, budget, min_prob):
    """A wrong stream choice: ties go to the last stream (the run-wide tree)."""
    own, best = streams[0], streams[0].draft(budget, min_prob)
    for other in streams[1:]:
        d = other.draft(budget, min_prob)
        if expected_length(d.probs) >= expected_length(best.probs):
            own, best = other, d
    return own, best


def test_the_stream_choice_is_the_rule_in_one_place():
    """`pick_stream` (the compiled rule every draft uses) picks the stream the Python reference
    picks, on rows where the trees often tie (a small vocabulary); ties going to the other
    stream would be caught."""
    rng, wrong_caught = random.Random(3), 0
    for _ in range(300):
        own, shared = SuffixTree(64), SuffixTree(24)
        for tree in (own, shared):
            for _ in range(rng.randint(0, 4)):
                tree.add([rng.randrange(3) for _ in range(rng.randint(1, 12))])
        row = (own.stream(), shared.stream())
        for s in row:
            s.extend([rng.randrange(3) for _ in range(rng.randint(1, 6))])
        room = rng.randint(0, 8)
        stream, draft = best_draft(row, room, 0.1)
        assert row[pick_stream(row, room, 0.1)] is stream
        assert picked_draft(row, room, 0.1)[1] == draft
        wrong_caught += _last_on_ties(row, room, 0.1)[0] is not stream
    assert wrong_caught > 0


def _fingerprint(tree: SuffixTree, paths: list) -> tuple:
    return (tree.stats(), [tree.count(p) for p in paths], [tree.draft(p, 8).tokens for p in paths])


def test_threads_leave_every_tree_as_one_thread_does():
    """Many group trees and one run-wide tree that every row feeds, fed alike on 1 and on 4
    threads: each step's results, drafts and, at the end, every tree agree. (Two threads on one
    tree would race: built that way, this test fails.)"""
    rng = random.Random(1)
    vocab, rows, groups = 6, 96, 12
    setups = []
    for _ in range(2):
        trees = [SuffixTree(64) for _ in range(groups)] + [SuffixTree(24)]
        setups.append((trees, [(trees[i % groups].stream(), trees[-1].stream()) for i in range(rows)]))
    ids = np.array([[rng.randrange(vocab) for _ in range(600)] for _ in range(rows)], dtype=np.int64)
    seen = np.zeros(rows, dtype=np.int64)
    for _ in range(60):
        n = seen + np.array([rng.randint(0, 8) for _ in range(rows)])
        rooms = np.array([rng.randint(0, 8) for _ in range(rows)])
        got = [(feed_many(rows_of(streams), ids, np.arange(rows), seen, n, n, np.array([99]), [[]] * rows, t),
                draft_many(rows_of(streams), rooms, 0.1, t)) for (_, streams), t in zip(setups, (1, 4))]
        assert got[0] == got[1]
        seen = n
    paths = [ids[i, j:j + rng.randint(1, 6)].tolist() for i, j in ((rng.randrange(rows), rng.randrange(500))
                                                                     for _ in range(300))]
    for one, many in zip(*(trees for trees, _ in setups)):
        assert _fingerprint(one, paths) == _fingerprint(many, paths)


def test_a_row_drafts_from_its_first_stream_on_a_tie():
    a, b = SuffixTree(8), SuffixTree(8)
    for t, toks in ((a, [5, 6, 7]), (b, [5, 6, 9])):
        t.add(toks)
    ra, rb = a.stream(), b.stream()
    for s in (ra, rb):
        s.extend([5, 6])
    rooms = np.array([4, 4])
    assert draft_many([(ra.core, rb.core), (rb.core, ra.core)], rooms, 0.1) == [[7], [9]]


def test_bad_arguments_are_refused_and_nothing_is_fed():
    t = SuffixTree(8)
    s = t.stream()
    ids = np.array([[3, 4, 5]], dtype=np.int64)
    one = np.array([0], dtype=np.int64)
    args = ([(s.core,)], ids, one, one, np.array([3]), np.array([9]), np.array([EOS]), [[]])
    with pytest.raises(TypeError, match="ids"):
        feed_many(args[0], ids.astype(np.float64), *args[2:])
    with pytest.raises(ValueError, match="differ in length"):
        feed_many(args[0], ids, np.array([0, 0]), *args[3:])
    with pytest.raises(ValueError, match="row 0"):
        feed_many(args[0], ids, one, one, np.array([4]), *args[5:])  # past the width of ids
    with pytest.raises(ValueError, match="row 0"):
        feed_many([(s,)], *args[1:])  # the wrapper, not its core
    assert t.stats().tokens == 0
    s.close()
    with pytest.raises(ValueError, match="closed"):
        feed_many(*args)
    with pytest.raises(ValueError, match="NaN"):
        draft_many([(s.core,)], one, float("nan"))


def test_a_draft_of_anything_but_ints_is_refused_and_a_huge_id_matches_nothing():
    t = SuffixTree(8)
    s = t.stream()
    ids = np.array([[3, 4, 5]], dtype=np.int64)
    one = np.array([0], dtype=np.int64)
    with pytest.raises(ValueError, match="list of token ids"):
        feed_many([(s.core,)], ids, one, one, np.array([3]), np.array([9]), np.array([EOS]), [[3, "4"]])
    assert t.stats().tokens == 0
    fed, accepted = feed_many([(s.core,)], ids, one, one, np.array([3]), np.array([9]), np.array([EOS]), [[3, 2**80]])
    assert (fed, accepted) == ([3], [1])
