"""Packed training on the real pretrained model (SmolLM2-135M-Instruct, 30 layers; prepared by
examples/smollm2/prepare.py, skipped without it): one optimizer step over prefix-tree rows, its
decoder layers checkpointed, gives the loss and gradients of the plain per-sequence step.

The steps are K answers of one workload prompt in the model's chat format, some sharing their
first sentences, with the model's own old log-probs (jittered, so some ratios clip) and mixed
rewards, as a GRPO group has them."""

from __future__ import annotations

import json
import random

import pytest
import torch

from srtcli.models import load_model_and_tokenizer
from srtcli.pool import StepRecord
from srtcli.tokenizers import encode_prompt
from srtcli.train.data import load_packed, load_steps
from srtcli.train.loss import LossConfig
from tests.srtcli.train.fixtures import fill_old_logprobs, grads, pack_pool, rel_diff, write_pool

ANSWERS = [
    "Omar starts with 94 pens. He gives away 6, so 94 - 6 = 88.\n#### 88",
    "Omar starts with 94 pens. He gives away 6 pens. 94 - 6 = 86.\n#### 86",
    "Omar has 94 pens and gives away 6. The final answer is 88.",
    "We subtract: 94 - 6 = 88 pens are left.\n#### 88",
    "94 pens minus 6 pens leaves 90 pens.\n#### 90",
]
TOL = 1e-4  # float32 through 30 layers: measured below 2e-5


@pytest.fixture(scope="module")
def pool(real_model, tmp_path_factory):
    torch.set_num_threads(2)
    model, tok = load_model_and_tokenizer(real_model)
    record = json.loads(open("examples/smollm2/prompts.jsonl").readline())
    prompt = encode_prompt(tok, record["prompt"])
    rng = random.Random(0)
    steps = []
    for i, text in enumerate(ANSWERS):
        response = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        steps.append(StepRecord("p0", f"t{i}", 0, prompt + response, [0] * len(prompt) + [1] * len(response),
                                [0.0] * (len(prompt) + len(response)), float("#### 88" in text or "is 88" in text)))
    rng.shuffle(steps)
    fill_old_logprobs(model, steps)
    root = tmp_path_factory.mktemp("real-train")
    write_pool(steps, root / "pool")
    return root / "pool", pack_pool(root / "pool", root / "shards", 4096)


def test_a_checkpointed_packed_step_on_the_real_model_is_the_plain_step(real_model, pool):
    steps, shards = pool
    plain, packed = load_steps(steps).rows, load_packed(shards).rows
    assert sum(r.packed_tokens for r in packed) < 0.5 * sum(r.tokens for r in plain)  # the prompt is shared
    cfg = LossConfig(clip=0.2, agg="token-mean")
    want_loss, want = grads(real_model, plain, cfg)
    loss, got = grads(real_model, packed, cfg, checkpointed=True)
    assert want_loss != 0.0 and abs(loss - want_loss) <= TOL * abs(want_loss)
    assert rel_diff(got, want) <= TOL
