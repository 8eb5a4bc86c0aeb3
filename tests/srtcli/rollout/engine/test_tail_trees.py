"""Tail trees (the engine's `tail_nodes`): a step never verifies more positions than a full batch
of chains would, and when fewer rows run, each drafts a tree of its share of the free positions
(`Drafter.propose_tree`). Greedy output stays token-identical to plain greedy decoding (and
breaking the tree's KV moves is caught), sampled continuations follow the model's distribution
exactly (and a biased walk is caught), and drafters without trees draft chains as before."""

from __future__ import annotations

import pytest
import torch

import srtcli.rollout.engine.tree_verify as tree_mod
from srtcli.rollout.drafters.base import Drafter, Proposal
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import TAIL_POSITIONS, Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from tests.srtcli.rollout.engine import test_engine_sampling as ts
from tests.srtcli.rollout.engine.test_engine import PROMPTS, drive
from tests.srtcli.rollout.engine.test_tree_verify import OracleTree, biased_walk
from tests.srtcli.rollout.engine.support import plain_greedy, tiny_model

torch.set_num_threads(1)


def test_a_rows_share_is_what_a_full_batch_of_chains_leaves_it():
    eng = Engine(tiny_model("qwen2"), SamplingParams(0.0), Drafter(), slots=8, budget=4, max_len=64, tail_nodes=20)
    # 8 slots x (1 pending + 4 drafted) = 40 positions a step
    assert [eng._tree_nodes(r) for r in (8, 7, 5, 4, 2, 1)] == [0, 0, 7, 9, 19, 20]
    eng.tail_nodes = 0
    assert [eng._tree_nodes(r) for r in (8, 4, 1)] == [0, 0, 0]
    # a large batch's full positions (256 x 9) are past where a GPU forward turns compute-bound:
    # the tail shares TAIL_POSITIONS, so trees start once a row's share passes 9: 51 rows
    big = Engine(tiny_model("qwen2"), SamplingParams(0.0), Drafter(), slots=256, budget=8, max_len=16, tail_nodes=64)
    assert TAIL_POSITIONS == 512
    assert [big._tree_nodes(r) for r in (255, 56, 52, 51, 32, 8, 1)] == [0, 0, 0, 9, 15, 63, 64]


class TailOracle(OracleTree):
    """Drafts no chains; its trees hide plain greedy's continuation in a later branch (so the
    tree's masks, positions and KV moves all matter) and record each tree's size and the rows
    of its step."""

    def __init__(self, refs):
        super().__init__(refs)
        self.engine, self.trees = None, []

    def propose(self, seq, budget):
        return Proposal([])

    def propose_tree(self, seq, nodes):
        self.trees.append((nodes, sum(s.pending is None for s in self.engine.active())))
        return super().propose(seq, nodes)


def oracle_run(kind: str, tail_nodes: int, slots: int = 4, budget: int = 2):
    model = tiny_model(kind, sharp=4.0)
    new = [8 + 3 * i for i in range(len(PROMPTS) * 2)]
    refs = {tuple(p): plain_greedy(model, p, max(new)) for p in PROMPTS}
    drafter = TailOracle(refs)
    eng = drafter.engine = Engine(model, SamplingParams(temperature=0), drafter, slots=slots, budget=budget,
                                  max_len=128, tail_nodes=tail_nodes, draft_length="fixed")
    seqs = [Sequence(p, max_new_tokens=n) for p, n in zip(PROMPTS * 2, new)]
    drive(eng, seqs)
    return eng, drafter, [s.output == refs[tuple(s.prompt_ids)][: s.max_new_tokens] for s in seqs]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_greedy_with_tail_trees_is_token_identical_to_plain_greedy(kind):
    eng, drafter, same = oracle_run(kind, tail_nodes=6)
    assert all(same)
    assert drafter.trees and eng.stats.accepted > 0  # the tail's trees were drafted and accepted
    # only where rows were missing, never past a full batch's 4 x (1 + 2) positions
    assert all(rows < 4 and rows * (1 + nodes) <= 4 * 3 for nodes, rows in drafter.trees)


def test_without_tail_trees_a_chain_drafter_is_asked_for_chains_only():
    eng, drafter, same = oracle_run("qwen2", tail_nodes=0)
    assert all(same) and drafter.trees == [] and eng.stats.drafted == 0


def test_tail_trees_without_their_kv_moves_change_the_output(monkeypatch):
    monkeypatch.setattr(tree_mod, "accepted_moves", lambda base, path: [])
    _, _, same = oracle_run("llama", tail_nodes=6)
    assert not all(same)


class CountedTrees(SrtDrafter):
    """The default sample mode, counting the tail trees it is asked for."""

    def __init__(self, **kw):
        super().__init__(mode="sample", **kw)
        self.asked = 0

    def propose_tree(self, seq, nodes):
        self.asked += 1
        return super().propose_tree(seq, nodes)


def tail_sample(model, params):
    """`test_engine_sampling`'s N continuations, with only 8 of the engine's 64 slots in use at a
    time, so every step has room for tail trees."""
    drafter = CountedTrees(min_prob=0.0)
    eng = Engine(model, params, drafter, slots=64, budget=4, max_len=32, tail_nodes=6, draft_length="fixed")
    seqs = [Sequence(ts.PROMPT, max_new_tokens=ts.NEW, group=f"g{i % 4}") for i in range(ts.N)]
    todo = list(seqs)
    while todo or eng.active():
        while todo and len(eng.active()) < 8:
            eng.admit(todo.pop())
        eng.step()
    counts: dict[tuple[int, ...], int] = {}
    for s in seqs:
        counts[tuple(s.output)] = counts.get(tuple(s.output), 0) + 1
    return counts, eng, drafter


def test_tail_tree_sampling_matches_the_model_exactly():
    model = ts.tiny_model("qwen2", vocab=ts.V, sharp=6.0, seed=3)
    params = SamplingParams(1.0)
    counts, eng, drafter = tail_sample(model, params)
    assert drafter.asked > ts.N and eng.stats.accepted > 0.2 * ts.N
    assert ts.fit(counts, ts.exact(model, params)) > 1e-3


def test_a_biased_walk_of_the_tail_trees_is_caught(monkeypatch):
    monkeypatch.setattr(tree_mod, "walk_tree", biased_walk)
    model = ts.tiny_model("qwen2", vocab=ts.V, sharp=6.0, seed=3)
    params = SamplingParams(1.0)
    counts, _, _ = tail_sample(model, params)
    assert ts.fit(counts, ts.exact(model, params)) < 1e-6
