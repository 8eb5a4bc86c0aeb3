"""Tree verification (srtcli/rollout/engine/tree_verify.py, `--draft-mode tree`): the layout helpers, greedy
output token-identical to plain greedy decoding when the right continuation hides in a later
branch (so sibling hiding, depth positions and the KV moves all matter, and breaking any one is
caught), and sampled continuations distributed exactly as the model's (a biased walk fails)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import srtcli.rollout.engine.tree_verify as tree_mod
from srtcli.rollout.drafters.base import Drafter, Proposal
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sequence import Sequence
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.tree_verify import accepted_moves, depths, tree_layout, walk_tree
from tests.srtcli.rollout.engine import test_engine_sampling as ts
from tests.srtcli.rollout.engine.test_engine import PROMPTS, drive
from tests.srtcli.rollout.engine.support import VOCAB, plain_greedy, tiny_model

torch.set_num_threads(1)

# node:      0  1  2  3  4  5
PARENTS = [-1, -1, 0, 1, 1, 4]  # two root children; node 1 has two children; 5 under 4


def test_layout_positions_follow_depth_and_hide_what_is_not_an_ancestor():
    assert depths(PARENTS) == [1, 1, 2, 2, 2, 3]
    pos, sees = tree_layout(10, 2, PARENTS)  # pending at columns 10, 11; nodes at 12..17
    assert pos == [10, 11, 12, 12, 13, 13, 13, 14]
    assert [sorted(np.flatnonzero(row)) for row in sees] == [[0], [1], [0, 2], [1, 3], [1, 4], [1, 4, 5]]


def test_walk_follows_drawn_children_and_stops_at_the_first_miss():
    toks = [7, 8, 9, 3, 4, 5]
    # x[0] after the pending tokens, x[1 + i] after node i
    assert walk_tree([8, 0, 4, 0, 0, 6, 0], toks, PARENTS) == ([1, 4], 6)
    assert walk_tree([8, 0, 4, 0, 0, 5, 1], toks, PARENTS) == ([1, 4, 5], 1)
    assert walk_tree([2, 0, 0, 0, 0, 0, 0], toks, PARENTS) == ([], 2)
    assert accepted_moves(20, [1, 4, 5]) == [(21, 20), (24, 21), (25, 22)]
    assert accepted_moves(20, [0, 2]) == [(22, 21)]


class OracleTree(Drafter):
    """Knows plain greedy's continuation and always hides it in a later branch: node 0 is a
    wrong token, node 1 the right one, node 3 a wrong child of 1 and node 4 the right one, with
    the right node 5 under it. The accepted path is then 1 -> 4 -> 5: moves and masks matter."""

    name = "oracle-tree"

    def __init__(self, refs: dict[tuple, list[int]]):
        self.refs = refs

    def propose(self, seq, budget):
        ref, i = self.refs[tuple(seq.prompt_ids)], len(seq.output)
        if seq.output != ref[:i] or i + 3 > len(ref):
            return Proposal([])
        wrong = [(t + 1) % VOCAB for t in ref[i: i + 3]]
        toks = [wrong[0], ref[i], wrong[1], wrong[1], ref[i + 1], ref[i + 2]]
        return Proposal(toks, parents=list(PARENTS)).truncate(budget)


def oracle_run(kind: str):
    model = tiny_model(kind, sharp=4.0)
    new = [8 + 3 * i for i in range(len(PROMPTS) * 2)]
    refs = {tuple(p): plain_greedy(model, p, max(new)) for p in PROMPTS}
    eng = Engine(model, SamplingParams(temperature=0), OracleTree(refs), slots=3, budget=6, max_len=128,
                 draft_length="fixed")
    seqs = [Sequence(p, max_new_tokens=n) for p, n in zip(PROMPTS * 2, new)]
    drive(eng, seqs)
    return eng, [s.output == refs[tuple(s.prompt_ids)][: s.max_new_tokens] for s in seqs]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_greedy_with_trees_is_token_identical_to_plain_greedy(kind):
    eng, same = oracle_run(kind)
    assert all(same)
    assert eng.accepted_per_forward > 2.5  # the later branches really were accepted


def _no_hiding(start, pending, parents):  # every earlier node visible, as in a chain
    n = len(parents)
    return tree_layout(start, pending, parents)[0], np.tril(np.ones((n, n), dtype=bool))


def _column_positions(start, pending, parents):
    return list(range(start, start + pending + len(parents))), tree_layout(start, pending, parents)[1]


@pytest.mark.parametrize("break_it", ["no sibling hiding", "column positions", "no KV moves"])
def test_each_broken_part_of_tree_verification_changes_the_output(break_it, monkeypatch):
    if break_it == "no sibling hiding":
        monkeypatch.setattr(tree_mod, "tree_layout", _no_hiding)
    elif break_it == "column positions":
        monkeypatch.setattr(tree_mod, "tree_layout", _column_positions)
    else:
        monkeypatch.setattr(tree_mod, "accepted_moves", lambda base, path: [])
    _, same = oracle_run("llama")
    assert not all(same)


@pytest.mark.parametrize("params,groups", [(SamplingParams(1.0), 1), (SamplingParams(0.7, top_p=0.85), 16)])
def test_tree_drafted_sampling_matches_the_model_exactly(params, groups):
    model = ts.tiny_model("qwen2", vocab=ts.V, sharp=6.0, seed=3)
    counts, eng = ts.sample(model, SrtDrafter(mode="tree", min_prob=0.0), params, groups=groups)
    assert eng.stats.accepted > 0.2 * ts.N
    assert ts.fit(counts, ts.exact(model, params)) > 1e-3


def biased_walk(x, tokens, parents):
    """A wrong walk: where the draw misses every child, it emits the first child instead."""
    path, final = walk_tree(x, tokens, parents)
    node = path[-1] if path else -1
    kids = [i for i, par in enumerate(parents) if par == node]
    return (path, tokens[kids[0]]) if kids else (path, final)


def test_a_walk_that_falls_back_to_a_drafted_child_is_caught(monkeypatch):
    monkeypatch.setattr(tree_mod, "walk_tree", biased_walk)
    model = ts.tiny_model("qwen2", vocab=ts.V, sharp=6.0, seed=3)
    params = SamplingParams(1.0)
    counts, _ = ts.sample(model, SrtDrafter(mode="tree", min_prob=0.0), params)
    assert ts.fit(counts, ts.exact(model, params)) < 1e-6
