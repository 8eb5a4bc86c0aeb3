"""Exactness: one optimizer step over packed shards equals the plain per-step reference.

Same initial weights, same steps: `--shards` (prefix-tree rows, tree attention) and `--steps`
(one plain causal row per step) must give the same loss and gradients within 1e-5 relative
(float32), for every scenario, loss aggregation, with and without KL, and whatever the
micro-batching. A deliberately wrong variant (one advantage per shared packed token) fails.
With SRT_TEST_DEVICE=cuda (bench/gpu_check.sh) the steps run on the GPU, and the compiled
FlexAttention, `srt train`'s default there, joins the backends checked.
"""

from __future__ import annotations

import pytest
import torch

from srtcli.train.loss import AGG_MODES, LossConfig, Normalizers, aggregate, count_normalizers, token_losses
from srtcli.train.data import load_packed, load_steps
from srtcli.train.logprobs import packed_logprobs, targets_of
from tests.srtcli.train.fixtures import (
    DEVICE, SCENARIOS, grads, load, model_dir, pack_pool, rel_diff, scenario, write_pool,
)

TOL = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"policy": model_dir(root / "policy", seed=0), "ref": model_dir(root / "ref", seed=1),
            "llama": model_dir(root / "llama", kind="llama", seed=2)}


@pytest.fixture(scope="module")
def data(models, tmp_path_factory):
    """Per scenario: (plain rows, packed rows), packed by the real `srt pack` on disk."""
    out = {}
    for name, (_, max_tokens) in SCENARIOS.items():
        root = tmp_path_factory.mktemp(name)
        pool = write_pool(scenario(name, models["policy"]), root / "pool")
        (root / "pool").mkdir(exist_ok=True)
        shards = pack_pool(pool, root / "shards", max_tokens)
        out[name] = (load_steps(pool).rows, load_packed(shards).rows)
    return out


def _check(a, b):
    (la, ga), (lb, gb) = a, b
    # the loss is a sum of signed terms that can cancel to near 0 (-0.0017 with KL 0.1): its
    # float32 rounding is relative to the terms, so the floor is the terms' scale, not 0
    assert abs(la - lb) <= TOL * max(abs(lb), 1e-2), (la, lb)
    assert rel_diff(ga, gb) <= TOL


def test_scenarios_are_what_they_claim(data):
    plain, packed = data["group_split_across_rows"]
    assert len(packed) > 1 and len({r.packed.seq_ids[0] for r in packed}) == len(packed)
    plain, packed = data["many_groups_per_row"]
    assert len(packed) == 1 and len(packed[0].seqs) == len(plain) == 12
    for name, (plain, packed) in data.items():
        assert sum(r.packed_tokens for r in packed) < sum(r.tokens for r in plain), name
        assert sorted(s.input_ids for r in packed for s in r.seqs) == sorted(s.input_ids for r in plain for s in r.seqs)


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_packed_equals_plain(models, data, name, agg, kl):
    plain, packed = data[name]
    cfg = LossConfig(clip=0.2, kl_coef=kl, agg=agg)
    ref = models["ref"] if kl else None
    want = grads(models["policy"], plain, cfg, micro=0, ref_path=ref)
    got = grads(models["policy"], packed, cfg, micro=0, ref_path=ref)
    _check(got, want)


@pytest.mark.parametrize("micro", [1, 64, 100000])
def test_micro_batching_does_not_change_the_step(models, data, micro):
    plain, packed = data["many_groups_per_row"]
    cfg = LossConfig(agg="seq-mean-token-mean", kl_coef=0.05)
    want = grads(models["policy"], plain, cfg, micro=0, ref_path=models["ref"])
    _check(grads(models["policy"], plain, cfg, micro=micro, ref_path=models["ref"]), want)
    _, packed_split = data["group_split_across_rows"]
    plain_split, _ = data["group_split_across_rows"]
    _check(grads(models["policy"], packed_split, cfg, micro=micro), grads(models["policy"], plain_split, cfg))


# FlexAttention has no backward on a CPU; with SRT_TEST_DEVICE=cuda it is `srt train`'s default
@pytest.mark.parametrize("attn", ["eager"] + (["flex"] if DEVICE.startswith("cuda") else []))
def test_every_attention_backend(models, data, attn):
    plain, packed = data["duplicates"]
    cfg = LossConfig(agg="seq-mean-token-sum", kl_coef=0.1)
    want = grads(models["policy"], plain, cfg, ref_path=models["ref"])
    _check(grads(models["policy"], packed, cfg, ref_path=models["ref"], attn=attn), want)


def test_llama_too(models, tmp_path):
    steps = scenario("multi_turn", models["llama"], seed=3)
    pool = write_pool(steps, (tmp_path / "pool"))
    shards = pack_pool(pool, tmp_path / "shards", 4096)
    cfg = LossConfig(agg="token-mean")
    _check(grads(models["llama"], load_packed(shards).rows, cfg), grads(models["llama"], load_steps(pool).rows, cfg))


def _first_sharer_advantage_grads(model_path, rows, cfg):
    """WRONG on purpose: every packed token takes the advantage of the first sequence on it."""
    model = load(model_path)
    seqs = [s for r in rows for s in r.seqs]
    norm = count_normalizers([s.loss_mask for s in seqs])
    for r in rows:
        lps = packed_logprobs(model, r.packed, "sdpa")
        width = max(len(s) - 1 for s in r.seqs)
        lp = torch.stack([torch.cat([x, x.new_zeros(width - x.numel())]) for x in lps])
        old, mask, adv = targets_of(r.seqs, width, "cpu")
        owner: dict[int, float] = {}
        tok_adv = torch.zeros_like(lp)
        for i, p in enumerate(r.packed.paths):
            for j, pos in enumerate(p[1:].tolist()):
                owner.setdefault(pos, float(adv[i]))
                tok_adv[i, j] = owner[pos]
        loss, *_ = token_losses(lp.masked_fill(mask == 0, 0), old, tok_adv, None, cfg)
        aggregate(loss, mask, cfg, Normalizers(norm.tokens, norm.seqs)).backward()
    return 0.0, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["k_samples", "duplicates"])
def test_losing_the_per_sequence_advantage_is_caught(models, data, name):
    plain, packed = data[name]
    cfg = LossConfig(agg="token-mean")
    want = grads(models["policy"], plain, cfg)
    _, wrong = _first_sharer_advantage_grads(models["policy"], packed, cfg)
    assert rel_diff(wrong, want[1]) > 100 * TOL
    _, right = grads(models["policy"], packed, cfg)
    assert rel_diff(right, want[1]) <= TOL


def test_plain_path_head_chunks_change_nothing(models, data, monkeypatch):
    """The reference path scores the LM head in checkpointed chunks; chunk size and the
    full-logits fallback give the same step."""
    import srtcli.train.logprobs as tf

    plain, _ = data["many_groups_per_row"]
    cfg = LossConfig(agg="seq-mean-token-mean", kl_coef=0.1)
    want = grads(models["policy"], plain, cfg, ref_path=models["ref"])
    monkeypatch.setattr(tf, "CHUNK", 7)
    _check(grads(models["policy"], plain, cfg, ref_path=models["ref"]), want)
    monkeypatch.setattr(tf, "head_split", lambda model: (None, None))
    _check(grads(models["policy"], plain, cfg, ref_path=models["ref"]), want)
