"""The objective, checked against a plain-Python transcription of the formulas, and the
batch plan (optimizer-step batches, ranks, micro-batches)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from srtcli.train.loss import AGG_MODES, LossConfig, batch_loss, count_normalizers
from srtcli.train.data import TrainSeq, WorkRow, micro_batches, plan_batches, split_ranks

torch.set_num_threads(1)


def python_loss(seqs, cfg):
    """Straight from the docstring of srtcli/train/loss.py, one token at a time."""
    per_seq, all_tokens = [], []
    for lp, old, ref, mask, adv in seqs:
        toks = []
        for t in range(len(lp)):
            if not mask[t]:
                continue
            ratio = math.exp(lp[t] - old[t])
            clipped = min(max(ratio, 1 - cfg.clip), 1 + cfg.clip)
            pg = max(-adv * ratio, -adv * clipped)
            d = ref[t] - lp[t]
            toks.append(pg + cfg.kl_coef * (math.exp(d) - d - 1))
        all_tokens += toks
        if toks:
            per_seq.append(sum(toks) if cfg.agg == "seq-mean-token-sum" else sum(toks) / len(toks))
    if cfg.agg == "token-mean":
        return sum(all_tokens) / len(all_tokens)
    return sum(per_seq) / len(per_seq)


def random_batch(rng, n=5, width=9):
    seqs = []
    for i in range(n):
        L = rng.randrange(1, width + 1)
        mask = [rng.random() < 0.6 for _ in range(L)] + [False] * (width - L)
        if i == 0:
            mask = [False] * width  # a sequence with nothing to train
        lp = [rng.uniform(-3, -0.1) for _ in range(width)]
        old = [x + rng.uniform(-0.4, 0.4) for x in lp]
        ref = [x + rng.uniform(-0.5, 0.5) for x in lp]
        seqs.append((lp, old, ref, [int(m) for m in mask], rng.uniform(-2, 2)))
    return seqs


def tensors(seqs):
    lp = torch.tensor([s[0] for s in seqs], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([s[1] for s in seqs], dtype=torch.float64)
    ref = torch.tensor([s[2] for s in seqs], dtype=torch.float64)
    mask = torch.tensor([s[3] for s in seqs], dtype=torch.float64)
    adv = torch.tensor([s[4] for s in seqs], dtype=torch.float64)
    return lp, old, ref, mask, adv


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("kl", [0.0, 0.3])
def test_matches_the_formula(agg, kl):
    cfg = LossConfig(clip=0.2, kl_coef=kl, agg=agg)
    rng = random.Random(AGG_MODES.index(agg) * 10 + int(kl * 10))
    seqs = random_batch(rng, n=12)
    lp, old, ref, mask, adv = tensors(seqs)
    norm = count_normalizers([s[3] for s in seqs])
    share, stats = batch_loss(lp, old, adv, mask, ref, cfg, norm)
    assert float(share.detach()) == pytest.approx(python_loss(seqs, cfg), rel=1e-12)
    assert stats.tokens == sum(sum(s[3]) for s in seqs) and 0 < stats.clipped < stats.tokens
    # a wrong aggregation is told apart
    other = LossConfig(clip=0.2, kl_coef=kl, agg=next(a for a in AGG_MODES if a != agg))
    assert float(share.detach()) != pytest.approx(python_loss(seqs, other), rel=1e-6)


def test_shares_of_a_split_batch_add_up_to_the_whole():
    """Global normalisers make every micro-batch's loss an exact share of the batch loss."""
    cfg = LossConfig(agg="seq-mean-token-mean", kl_coef=0.1)
    seqs = random_batch(random.Random(3), n=8)
    norm = count_normalizers([s[3] for s in seqs])
    lp, old, ref, mask, adv = tensors(seqs)
    whole, _ = batch_loss(lp, old, adv, mask, ref, cfg, norm)
    (g_whole,) = torch.autograd.grad(whole, lp)
    parts = [slice(0, 3), slice(3, 4), slice(4, 8)]
    total = 0.0
    lp2 = lp.detach().clone().requires_grad_(True)
    for s in parts:
        share, _ = batch_loss(lp2[s], old[s], adv[s], mask[s], ref[s], cfg, norm)
        share.backward()
        total += float(share.detach())
    assert total == pytest.approx(float(whole.detach()), rel=1e-12)
    assert torch.allclose(lp2.grad, g_whole, rtol=1e-12, atol=1e-15)
    # dividing by the part's own counts (the classic data-parallel bug) does not add up
    wrong = sum(float(batch_loss(lp[s].detach(), old[s], adv[s], mask[s], ref[s], cfg,
                                 count_normalizers([x[3] for x in seqs[s]]))[0]) for s in parts)
    assert wrong != pytest.approx(float(whole.detach()), rel=1e-6)


def test_untrained_slots_cannot_leak_nan():
    lp = torch.tensor([[-1.0, 80.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.2, -90.0, 0.0]])
    share, _ = batch_loss(lp, old, torch.tensor([1.0]), torch.tensor([[1, 0, 0]]), None, LossConfig(), count_normalizers([[1, 0, 0]]))
    share.backward()
    assert torch.isfinite(share) and torch.isfinite(lp.grad).all() and lp.grad[0, 1:].eq(0).all()


def rows(lengths, per_row=1):
    return [WorkRow([TrainSeq([1] * n, [0] + [1] * (n - 1), [0.0] * n, 1.0) for _ in range(per_row)]) for n in lengths]


def test_batches_take_whole_rows_in_order():
    rs = rows([5, 6, 7, 8, 9], per_row=2)
    assert plan_batches(rs, 0) == [rs]
    assert plan_batches(rs, 3) == [rs[0:2], rs[2:4], rs[4:5]]
    assert plan_batches(rs, 4) == [rs[0:2], rs[2:4], rs[4:5]]


def test_ranks_balance_tokens_and_cover_every_row_once():
    rs = rows([100, 90, 10, 10, 10, 80, 5])
    parts = split_ranks(rs, 2)
    assert sorted(id(r) for p in parts for r in p) == sorted(id(r) for r in rs)
    loads = [sum(r.cost for r in p) for p in parts]
    assert sorted(loads) == [135, 170]  # the best split of these costs: {90, 80} and the rest
    for p in parts:  # each rank keeps data order
        assert [rs.index(r) for r in p] == sorted(rs.index(r) for r in p)
    assert split_ranks(rs, 2) == parts  # deterministic: every rank computes the same plan


def test_micro_batches_respect_the_token_budget():
    rs = rows([30, 10, 25, 5, 8, 40])
    for budget in (1, 40, 64, 1000):
        mbs = micro_batches(rs, budget)
        assert sorted(id(r) for m in mbs for r in m) == sorted(id(r) for r in rs)
        for m in mbs:
            assert len(m) == 1 or len(m) * max(r.cost for r in m) <= budget
    assert len(micro_batches(rs, 1000)) == 1 and len(micro_batches(rs, 0)) == 6
