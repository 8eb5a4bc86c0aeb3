"""Gradient checkpointing of decoder layers: the same step, a fraction of the kept activations.

A packed row's checkpointed layers recompute in the backward, after the row's tree attention
has exited; the step must still equal the plain per-sequence step (the exactness tolerance of
tests/srtcli/train/test_exact.py), and a recomputation that forgets the row must be caught.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils.checkpoint import CheckpointError

import attention.checkpointing as ac
from attention import row_logprobs
from srtcli.train.data import load_packed, load_steps
from srtcli.train.loss import LossConfig
from tests.srtcli.train.fixtures import DEVICE, SCENARIOS, grads, load, model_dir, pack_pool, rel_diff, scenario, write_pool

TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    models = {"policy": model_dir(root / "policy", seed=0), "ref": model_dir(root / "ref", seed=1)}
    data = {}
    for name in ("k_samples", "multi_turn", "group_split_across_rows"):
        pool = write_pool(scenario(name, models["policy"]), root / name / "pool")
        shards = pack_pool(pool, root / name / "shards", SCENARIOS[name][1])
        data[name] = (load_steps(pool).rows, load_packed(shards).rows)
    return models, data


# with SRT_TEST_DEVICE=cuda (bench/gpu_check.sh) the compiled FlexAttention recomputes too
@pytest.mark.parametrize("attn", ["sdpa"] + (["flex"] if DEVICE.startswith("cuda") else []))
@pytest.mark.parametrize("name", ["k_samples", "multi_turn", "group_split_across_rows"])
def test_checkpointed_packed_step_equals_the_plain_step(setup, name, attn):
    models, data = setup
    plain, packed = data[name]
    cfg = LossConfig(agg="seq-mean-token-mean", kl_coef=0.1)
    want_loss, want = grads(models["policy"], plain, cfg, ref_path=models["ref"])
    for rows in (packed, plain):
        loss, got = grads(models["policy"], rows, cfg, ref_path=models["ref"], checkpointed=True, attn=attn)
        assert abs(loss - want_loss) <= TOL * max(abs(want_loss), 1e-2)
        assert rel_diff(got, want) <= TOL


def test_a_recomputation_outside_the_row_is_caught(setup, monkeypatch):
    """WRONG on purpose: the backward recomputes each layer without the row's tree mask (what
    transformers' own checkpointing would do), so it attends causally over the packed row: torch
    sees the recomputed tensors differ from the forward's, or the gradients are wrong."""
    models, data = setup
    plain, packed = data["k_samples"]
    cfg = LossConfig(agg="token-mean")
    _, want = grads(models["policy"], plain, cfg)
    monkeypatch.setattr(ac, "recompute_context", lambda: (contextlib.nullcontext(), contextlib.nullcontext()))
    try:
        _, wrong = grads(models["policy"], packed, cfg, checkpointed=True)
    except CheckpointError:
        return
    assert rel_diff(wrong, want) > 100 * TOL


def _saved_bytes(model, row) -> int:
    """Bytes autograd keeps for the backward of one packed row's log-probs."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lps = row_logprobs(model, row, backend="sdpa")
    sum(lp.sum() for lp in lps).backward()
    return total


def test_checkpointing_keeps_a_fraction_of_the_activations(setup):
    models, data = setup
    row = data["k_samples"][1][0].packed
    kept = _saved_bytes(load(models["policy"]), row)
    model = load(models["policy"])
    assert ac.checkpoint_layers(model) == model.config.num_hidden_layers
    assert ac.checkpoint_layers(model) == model.config.num_hidden_layers  # idempotent: wrapped once
    assert _saved_bytes(model, row) < kept / 3


def test_forwards_without_gradients_run_plainly(setup):
    models, data = setup
    row = data["multi_turn"][1][0].packed
    plain = load(models["policy"])
    model = load(models["policy"])
    ac.checkpoint_layers(model)
    with torch.no_grad():
        for a, b in zip(row_logprobs(model, row), row_logprobs(plain, row)):
            assert torch.equal(a, b)


def test_a_model_without_decoder_layers_is_refused():
    with pytest.raises(ValueError, match="no decoder layers"):
        ac.checkpoint_layers(torch.nn.Linear(2, 2))
