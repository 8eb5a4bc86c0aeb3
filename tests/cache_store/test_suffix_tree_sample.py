"""`sample_draft`, the embedded srt drafter's default draft in one compiled call, is exactly the
Python walk it replaces: the stream `best_draft` picks, its draft tree of 4 x budget nodes,
each child drawn with `random.choices` over the children the tree lists. Same tokens, same q,
same distributions, the same number of draws from the generator; bad arguments refused.

With `stop`, children are drawn by the probability stored with their token (p-hat), the row's
other streams offer their children for the mass left over, and what is still left ends the
draft; the reference walk reads p-hat from the rule the sequences were stored with (a function
of the token and the one before it, so every occurrence agrees)."""

from __future__ import annotations

import math
import random
from collections import Counter
from bisect import bisect_right
from itertools import accumulate

import numpy as np
import pytest

from cache_store.suffix_tree import SuffixTree, sample_draft
from tests.cache_store.reference_tree import best_draft


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


def p_hat(prev: int, tok: int) -> float:
    """The probability stored with `tok` after `prev` (0 = tool output): a multiple of 16/254,
    so the tree's one byte holds it exactly, as the float32 the tree reads back."""
    return float(np.float32((prev * 7 + tok * 3) % 9 * 16) / np.float32(254))


def probs_of(tokens: list[int]) -> list[float]:
    return [math.nan] + [p_hat(a, b) for a, b in zip(tokens, tokens[1:])]


def stop_reference(streams, last, budget, min_prob, rng, others=True):
    """The stop walk in Python: the picked stream's draft tree leads, its children drawn by p-hat
    (those of p-hat 0 left out); the other streams' draft trees, walked along the same tokens,
    offer their children not offered yet for the mass the leader leaves, scaled down together
    if they would pass it; a draw past them all is the stop. A tree off the drawn path drops
    out, and the next one on it leads. `others=False`: the picked stream's tree alone."""
    stream, _ = best_draft(streams, budget, min_prob)
    trees = [s.draft_tree(budget=4 * budget, min_prob=min_prob) for s in
             [stream] + [s for s in streams if s is not stream and others]]
    kids = [{} for _ in trees]
    for t, k in zip(trees, kids):
        for i, par in enumerate(t.parents):
            k.setdefault(par, []).append(i)
    node, on = [-1] * len(trees), [True] * len(trees)

    def offered(i, prev):
        return [c for c in kids[i].get(node[i], []) if p_hat(prev, trees[i].tokens[c]) > 0] if on[i] else []

    toks, qs, dists, prev = [], [], [], last
    while len(toks) < budget:
        lead = next((i for i in range(len(trees)) if offered(i, prev)), None)
        if lead is None:
            break
        tokens = [trees[lead].tokens[c] for c in offered(lead, prev)]
        w = [p_hat(prev, t) for t in tokens]
        cum = list(accumulate(w))
        if cum[-1] < 1.0:
            rest, first, extra = 1.0 - cum[-1], len(w), 0.0
            for i in range(len(trees)):
                for c in (offered(i, prev) if i != lead else []):
                    if trees[i].tokens[c] not in tokens:
                        tokens.append(trees[i].tokens[c])
                        w.append(p_hat(prev, trees[i].tokens[c]))
                        extra += w[-1]
            scale = rest / extra if extra > rest else 1.0
            for k in range(first, len(w)):
                w[k] *= scale
                cum.append(cum[k - 1] + w[k])
        total = max(cum[-1], 1.0)
        dists.append({t: x / total for t, x in zip(tokens, w)})
        j = bisect_right(cum, rng.random() * total)
        if j == len(tokens) and total > cum[-1]:
            break
        j = min(j, len(tokens) - 1)
        prev = tokens[j]
        toks.append(prev)
        qs.append(w[j] / total)
        for i, t in enumerate(trees):
            nxt = [c for c in kids[i].get(node[i], []) if t.tokens[c] == prev] if on[i] else []
            on[i], node[i] = bool(nxt), (nxt[0] if nxt else -1)
    return toks, qs, dists


def random_streams(rng):
    """A prompt tree and a run-wide tree with stored and live sequences, and one row's streams."""
    return build_streams(rng, False)[0]


def build_streams(rng, probs: bool):
    """`random_streams` and the row's tokens; with `probs`, every token stored with its `p_hat`."""
    own, shared = SuffixTree(64), SuffixTree(24)
    vocab = rng.choice([2, 3, 6, 20])
    for tree in (own, shared):
        for _ in range(rng.randint(0, 6)):
            seq = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
            tree.add(seq, rng.choice([1.0, 0.5, 0.25]), probs_of(seq) if probs else None)
    row = (own.stream(), shared.stream())
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(int(probs), 30))]
    for s in row:
        s.extend(tokens, probs_of(tokens) if probs else None)
    return row, tokens


def test_sample_draft_is_the_python_walk():
    rng = random.Random(0)
    for case in range(300):
        row = random_streams(rng)
        budget, min_prob = rng.randint(1, 8), rng.choice([0.0, 0.1, 0.3])
        a, b = random.Random(case), random.Random(case)
        assert sample_draft(row, budget, min_prob, a.random) == reference(row, budget, min_prob, b)
        assert a.random() == b.random()  # as many draws on both sides


def test_stop_draws_children_by_their_stored_probability_and_the_rest_stops():
    rng = random.Random(5)
    stops = widened = 0
    for case in range(300):
        row, tokens = build_streams(rng, True)
        budget, min_prob = rng.randint(1, 8), rng.choice([0.0, 0.1, 0.3])
        a, b = random.Random(case), random.Random(case)
        got = sample_draft(row, budget, min_prob, a.random, stop=True)
        assert got == stop_reference(row, tokens[-1], budget, min_prob, b)
        assert a.random() == b.random()
        stops += len(got[2]) > len(got[0])
        widened += got != stop_reference(row, tokens[-1], budget, min_prob, random.Random(case), others=False)
    assert stops > 30  # the stop is drawn, not just possible
    assert widened > 30  # the other stream's children are offered, not just possible


def test_stop_falls_back_to_counts_where_a_childs_probability_is_unknown():
    tree = SuffixTree(16)
    tree.add([5, 1, 2], 3.0, [math.nan, 0.25, 0.5])
    tree.add([5, 3, 4], 1.0)  # stored without probabilities
    row = (tree.stream(),)
    row[0].extend([5])
    assert sample_draft(row, 1, 0.0, random.Random(0).random, stop=True)[2] == [{1: 0.75, 3: 0.25}]
    known = SuffixTree(16)
    known.add([5, 1, 2], 3.0, [math.nan, 0.25, 0.5])
    known.add([5, 3, 4], 1.0, [math.nan, 0.5, 1.0])
    row = (known.stream(),)
    row[0].extend([5])
    [dist] = sample_draft(row, 1, 0.0, random.Random(0).random, stop=True)[2]
    assert dist == {1: pytest.approx(0.25, abs=1 / 508), 3: 0.5}  # p-hat, kept in one byte


def test_the_other_streams_fill_the_mass_the_picked_one_leaves():
    own, shared = SuffixTree(16), SuffixTree(16)
    own.add([5, 1, 2, 3], 4.0, [math.nan, 0.25, 0.5, 0.5])  # picked: the longer, surer draft
    shared.add([5, 3], 1.0, [math.nan, 0.5])
    shared.add([5, 7], 1.0, [math.nan, 0.5])
    row = (own.stream(), shared.stream())
    for s in row:
        s.extend([5])
    [dist] = sample_draft(row, 1, 0.0, random.Random(0).random, stop=True)[2]
    # 1 keeps its p-hat; 3 and 7 (0.5 each) share the 0.75 left, scaled to fit
    assert dist == pytest.approx({1: 0.25, 3: 0.375, 7: 0.375}, abs=1 / 254)  # p-hat kept in one byte
    draws = Counter()
    rng = random.Random(1)
    for _ in range(2000):
        toks, _, dists = sample_draft(row, 3, 0.0, rng.random, stop=True)
        draws[toks[0]] += 1
        if toks[0] == 7:  # off the picked tree: the run-wide one leads, and it ends there
            assert toks == [7] and len(dists) == 1
    assert set(draws) == {1, 3, 7}


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
