"""`merged_draft`, a row's draft trees as one tree (the srt drafter's `--draft-mode tree` and the
engine's tail trees), is the Python merge it replaced: each stream's best-first draft tree
(the stream `best_draft` picks first), every node ranked by path score, each path once, parents
first, the earlier tree winning ties. The merge itself is checked against the best distinct
paths of the trees, by brute force."""

from __future__ import annotations

import random

import pytest

from cache_store.suffix_tree import DraftTree, SuffixTree, merged_draft
from tests.cache_store.reference_tree import best_draft


def merged_tree(trees: list[DraftTree], nodes: int) -> tuple[list[int], list[int]]:
    """The merge in Python: nodes by (-path score, tree, node), one merged node per (merged
    parent, token), stopping at the first new path past `nodes`."""
    ranked = []
    for k, tree in enumerate(trees):
        scores: list[float] = []
        for i, (par, c) in enumerate(zip(tree.parents, tree.probs)):
            scores.append((scores[par] if par >= 0 else 1.0) * c)
            ranked.append((-scores[i], k, i))
    ranked.sort()
    merged = [[-1] * len(tree.tokens) for tree in trees]  # the merged node each node became
    at: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    tokens, parents = [], []
    for _, k, i in ranked:
        par = trees[k].parents[i]
        key = (merged[k][par] if par >= 0 else -1, trees[k].tokens[i])
        if key not in at:
            if len(tokens) == nodes:
                break
            at[key] = len(tokens)
            tokens.append(key[1])
            parents.append(key[0])
        merged[k][i] = at[key]
    return tokens, parents


def reference(streams: tuple, nodes: int, min_prob: float) -> tuple[list[int], list[int]]:
    picked, _ = best_draft(streams, nodes, min_prob)
    ordered = [picked] + [s for s in streams if s is not picked]
    return merged_tree([s.draft_tree(budget=nodes, min_prob=min_prob) for s in ordered], nodes)


def paths_of(tokens: list[int], parents: list[int]) -> list[tuple]:
    out: list[tuple] = []
    for tok, par in zip(tokens, parents):
        assert par < len(out)  # a parent comes before its children
        out.append((out[par] if par >= 0 else ()) + (tok,))
    return out


def scored(tree: DraftTree) -> dict[tuple, float]:
    paths, scores = paths_of(tree.tokens, tree.parents), []
    for par, c in zip(tree.parents, tree.probs):
        scores.append((scores[par] if par >= 0 else 1.0) * c)
    return dict(zip(paths, scores))


def test_nodes_come_by_path_score_each_path_once():
    a = DraftTree([5, 6, 7], [-1, 0, -1], [0.75, 1.0, 0.25], 2)  # 5 (0.75), 5-6 (0.75), 7 (0.25)
    b = DraftTree([7, 8, 5], [-1, 0, -1], [0.5, 0.5, 0.5], 1)  # 7 (0.5), 7-8 (0.25), 5 (0.5)
    tokens, parents = merged_tree([a, b], 10)
    assert paths_of(tokens, parents) == [(5,), (5, 6), (7,), (7, 8)]
    assert merged_tree([a, b], 3) == ([5, 6, 7], [-1, 0, -1])


def test_ties_go_to_the_earlier_tree():
    chain = DraftTree([1, 2, 3], [-1, 0, 1], [1.0, 1.0, 1.0], 3)
    other = DraftTree([4, 5], [-1, 0], [1.0, 1.0], 1)
    assert merged_tree([chain, other], 3) == ([1, 2, 3], [-1, 0, 1])
    assert merged_tree([other, chain], 3) == ([4, 5, 1], [-1, 0, -1])


def random_tree(rng: random.Random, depth: int, vocab: int) -> SuffixTree:
    t = SuffixTree(depth)
    for _ in range(rng.randint(0, 5)):
        t.add([rng.randrange(vocab) for _ in range(rng.randint(2, 30))], rng.choice([1.0, 0.5, 0.25]))
    return t


def test_the_merge_is_the_best_distinct_paths_of_the_trees():
    rng = random.Random(0)
    for _ in range(200):
        vocab = rng.choice([2, 3, 6])
        trees = [random_tree(rng, depth, vocab).draft_tree([rng.randrange(vocab) for _ in range(rng.randint(1, 6))],
                                                            budget=rng.randint(1, 24), min_prob=rng.choice([0.0, 0.1]))
                 for depth in (64, 24)]
        nodes = rng.randint(1, 40)
        best: dict[tuple, tuple] = {}
        for k, tree in enumerate(trees):
            for i, (path, score) in enumerate(scored(tree).items()):
                best[path] = min(best.get(path, (2.0,)), (-score, k, i))
        assert paths_of(*merged_tree(trees, nodes)) == sorted(best, key=best.get)[:nodes]


def test_the_compiled_merge_is_the_python_one():
    rng = random.Random(1)
    merged = reordered = 0
    for case in range(400):
        vocab = rng.choice([2, 3, 6, 20])
        own, shared = random_tree(rng, 64, vocab), random_tree(rng, 24, vocab)
        row = (own.stream(), shared.stream())
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        for s in row:
            s.extend(tokens)
        nodes, min_prob = rng.randint(1, 64), rng.choice([0.0, 0.1, 0.3])
        got = merged_draft(row, nodes, min_prob)
        assert got == reference(row, nodes, min_prob), case
        merged += got != reference(row[:1], nodes, min_prob) and got != reference(row[1:], nodes, min_prob)
        reordered += got != merged_tree([s.draft_tree(budget=nodes, min_prob=min_prob) for s in row[::-1]], nodes)
    assert merged > 100  # both trees in the merge, not just possible
    assert reordered > 20  # and which comes first matters


def test_no_nodes_no_tree_and_bad_arguments_refused():
    row = (SuffixTree(8).stream(),)
    assert merged_draft(row, 0, 0.1) == ([], [])
    assert merged_draft(row, 5, 0.1) == ([], [])
    for args in [((), 4, 0.1), (row, -1, 0.1), (row, 4, float("nan"))]:
        with pytest.raises(ValueError):
            merged_draft(*args)
