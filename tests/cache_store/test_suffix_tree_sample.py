"""`sample_draft`, the embedded srt drafter's default draft in one compiled call, is exactly the
Python walk it replaces: the stream `best_draft` picks, its draft tree of 4 x budget nodes,
each child drawn with `random.choices` over the children the tree lists. Same tokens, same q,
same distributions, the same number of draws from the generator; bad arguments refused."""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import accumulate

import pytest

from cache_store.suffix_tree import SuffixTree, sample_draft
from srtcli.rollout.drafters.srt import best_draft


def reference(streams, budget, min_prob, rng):
    """The walk in Python: children by their listed frequency, `random.choices` per step."""
    stream, _ = best_draft(streams, budget, min_prob)
    dt = stream.draft_tree(budget=4 * budget, min_prob=min_prob)
    kids = {}
    for i, par in enumerate(dt.parents):
        kids.setdefault(par, []).append(i)
    toks, qs, dists, node = [], [], [], -1
    while len(toks) < budget and node in kids:
        idx = kids[node]
        total = list(accumulate(dt.probs[i] for i in idx))[-1]  # the total random.choices draws against
        node = rng.choices(idx, weights=[dt.probs[i] for i in idx])[0]
        toks.append(dt.tokens[node])
        qs.append(dt.probs[node] / total)
        dists.append({dt.tokens[i]: dt.probs[i] / total for i in idx})
    return toks, qs, dists


def random_streams(rng):
    """A prompt tree and a run-wide tree with stored and live sequences, and one row's streams."""
    own, shared = SuffixTree(64), SuffixTree(24)
    vocab = rng.choice([2, 3, 6, 20])
    for tree in (own, shared):
        for _ in range(rng.randint(0, 6)):
            tree.add([rng.randrange(vocab) for _ in range(rng.randint(1, 40))], rng.choice([1.0, 0.5, 0.25]))
    row = (own.stream(), shared.stream())
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 30))]
    for s in row:
        s.extend(tokens)
    return row


def test_sample_draft_is_the_python_walk():
    rng = random.Random(0)
    for case in range(300):
        row = random_streams(rng)
        budget, min_prob = rng.randint(1, 8), rng.choice([0.0, 0.1, 0.3])
        a, b = random.Random(case), random.Random(case)
        assert sample_draft(row, budget, min_prob, a.random) == reference(row, budget, min_prob, b)
        assert a.random() == b.random()  # as many draws on both sides


def test_the_first_token_follows_the_trees_child_frequencies():
    tree = SuffixTree(16)
    for seq, w in (([5, 1, 2], 3.0), ([5, 3, 4], 1.0), ([5, 7], 4.0)):
        tree.add(seq, w)
    row = (tree.stream(),)
    row[0].extend([5])
    rng = random.Random(1)
    n = 20_000
    first = Counter(sample_draft(row, 2, 0.0, rng.random)[0][0] for _ in range(n))
    for tok, p in ((1, 3 / 8), (3, 1 / 8), (7, 4 / 8)):
        assert abs(first[tok] / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    toks, qs, dists = sample_draft(row, 2, 0.0, random.Random(2).random)
    assert dists[0] == {7: 0.5, 1: 0.375, 3: 0.125} and qs[0] == dists[0][toks[0]]


def test_nothing_to_draft_gives_an_empty_draft():
    row = (SuffixTree(8).stream(),)
    assert sample_draft(row, 4, 0.1, random.random) == ([], [], [])
    assert sample_draft(random_streams(random.Random(3)), 0, 0.1, random.random) == ([], [], [])


def test_bad_arguments_are_refused():
    row = random_streams(random.Random(4))
    with pytest.raises(ValueError):
        sample_draft((), 4, 0.1, random.random)
    with pytest.raises(ValueError):
        sample_draft(row, -1, 0.1, random.random)
    with pytest.raises(ValueError):
        sample_draft(row, 4, math.nan, random.random)
    with pytest.raises(ValueError):
        sample_draft(row, 4, 0.1, 3)
    tree = SuffixTree(8)
    tree.add([1, 2, 3])
    live = (tree.stream(),)
    live[0].extend([1])
    with pytest.raises(TypeError):
        sample_draft(live, 4, 0.0, lambda: "not a float")
