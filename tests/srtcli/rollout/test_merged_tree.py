"""The srt drafter's draft trees (`--draft-mode tree`, the engine's tail trees): the best-first
trees of a row's prompt tree and run-wide tree merged into one, nodes by path score, each path
once, parents first, the picked stream winning ties."""

import random

from cache_store.suffix_tree import DraftTree, SuffixTree
from srtcli.rollout.drafters.srt import SrtDrafter, merged_tree
from srtcli.rollout.engine.sequence import Sequence


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


def test_the_merged_tree_is_the_best_paths_of_the_trees_it_merges():
    rng = random.Random(0)
    for _ in range(200):
        trees = []
        for depth in (64, 24):
            t = SuffixTree(depth)
            vocab = rng.choice([2, 3, 6])
            for _ in range(rng.randint(1, 5)):
                t.add([rng.randrange(vocab) for _ in range(rng.randint(2, 30))], rng.choice([1.0, 0.5]))
            ctx = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
            trees.append(t.draft_tree(ctx, budget=rng.randint(1, 24), min_prob=rng.choice([0.0, 0.1])))
        nodes = rng.randint(1, 40)
        got = paths_of(*merged_tree(trees, nodes))
        best: dict[tuple, tuple] = {}
        for k, tree in enumerate(trees):
            for i, (path, score) in enumerate(scored(tree).items()):
                best[path] = min(best.get(path, (2.0,)), (-score, k, i))
        want = sorted(best, key=best.get)[:nodes]
        assert got == want


def test_a_token_only_the_run_wide_tree_knows_is_verified_too():
    drafter = SrtDrafter()
    seq = Sequence([9, 1], max_new_tokens=32, group="g")
    drafter.begin(seq)
    own, shared = drafter.trees.groups["g"].tree, drafter.trees.shared
    own.add([1, 2, 3, 4], 4.0)  # the prompt's own rollouts: 1 -> 2 -> 3 -> 4
    shared.add([1, 7], 1.0)  # another prompt's: 1 -> 7
    prop = drafter.propose_tree(seq, 4)
    assert paths_of(prop.tokens, prop.parents) == [(2,), (2, 3), (2, 3, 4), (7,)]
