"""The rollout benchmark's `arctic` baseline (bench/arctic_drafter.py): ArcticInference's
SuffixDecodingCache behind srtcli's drafter interface. Greedy rollout through it is
token-identical to plain greedy decoding (verification is exact whatever the drafts, chains or
its speculation trees in the engine's tail trees), and one
drafter object given to the embedded backend keeps its cache of past responses across runs, as
the bench's epochs need. Skipped without arctic_inference (the optional `bench` extra)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("arctic_inference.suffix_decoding")

from bench.arctic_drafter import ArcticDrafter  # noqa: E402
from srtcli.pool import read_pool  # noqa: E402
from srtcli.rollout.config import RolloutConfig  # noqa: E402
from srtcli.rollout.driver import run_rollout  # noqa: E402
from srtcli.rollout.embedded import EmbeddedBackend  # noqa: E402
from srtcli.rollout.engine.engine import Engine  # noqa: E402
from srtcli.rollout.engine.sampling import SamplingParams  # noqa: E402
from srtcli.rollout.engine.sequence import Sequence  # noqa: E402
from tests.srtcli.rollout.engine.support import make_model_dir, plain_greedy, tiny_model  # noqa: E402

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7]]


class CountedTrees(ArcticDrafter):
    def __init__(self):
        super().__init__()
        self.trees = 0

    def propose_tree(self, seq, nodes):
        self.trees += 1
        return super().propose_tree(seq, nodes)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("tail_nodes", [0, 8])  # with 8, rows of a batch not full draft SuffixDecoding's trees
def test_greedy_rollout_is_token_identical_to_plain_greedy(kind, tail_nodes):
    model = tiny_model(kind, sharp=4.0)
    eos = {5}
    drafter = CountedTrees()
    eng = Engine(model, SamplingParams(temperature=0), drafter, slots=3, budget=5, max_len=128, eos_ids=eos,
                 draft_length="fixed", tail_nodes=tail_nodes)
    # prompts repeat, so cached responses of earlier requests have something to draft
    seqs = [Sequence(p, max_new_tokens=8 + 3 * i, group=str(i % 6)) for i, p in enumerate(PROMPTS * 2)]
    todo = list(seqs)
    while todo or eng.active():
        while todo and eng.free_slots():
            eng.admit(todo.pop(0))
        eng.step()
    for s in seqs:
        assert s.output == plain_greedy(model, s.prompt_ids, s.max_new_tokens, eos)
    assert 0 < eng.stats.accepted < eng.stats.drafted  # drafts were accepted, and rejected ones rolled back
    assert (drafter.trees > 0) == (tail_nodes > 0)


def test_one_drafter_keeps_past_responses_across_runs(tmp_path):
    model = make_model_dir(tmp_path / "model", sharp=60.0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": q, "answer": "2"}) + "\n"
                               for i, q in enumerate(["1+1?", "What is 7*6?", "Tom has 3 pens."])))
    drafter = ArcticDrafter()

    def run(name: str) -> tuple[dict, list]:
        c = RolloutConfig(str(prompts), model=str(model), k=2, max_new_tokens=24, temperature=0.0, draft="arctic", draft_length="fixed",
                          cache_opt=str(tmp_path / f"cache-{name}"), out=str(tmp_path / name), device="cpu")
        s = run_rollout(c, EmbeddedBackend("cpu", drafter))
        return s, sorted((st.meta["prompt_id"], st.meta["sample"], st.input_ids) for st in read_pool(tmp_path / name))

    first, pool1 = run("epoch1")
    second, pool2 = run("epoch2")
    assert pool2 == pool1  # greedy: the same tokens whatever was drafted
    assert second["draft"] == "arctic"
    # epoch 2 drafts epoch 1's responses of its own prompt: fewer forwards for the same tokens
    assert second["target_forwards"] < first["target_forwards"]
    assert len(drafter.cache.cached_requests) == 2 * 3 * 2
