"""One optimizer step's gradient: `step_gradients`, the heart of `srt train`.

After it returns, every parameter's `.grad` holds the gradient of the global batch loss,
identical (up to float rounding) whether the batch ran packed or plain, in one micro-batch or
many, on one rank or several; tests/srtcli/train/ checks exactly that. The pieces:

    srtcli.train.data      a batch -> this rank's rows -> micro-batches
    srtcli.train.logprobs  a micro-batch -> per-sequence log-probs (plain causal or tree-packed)
    srtcli.train.loss      PPO-clip + k3 KL, over *global* normalisers
    srtcli.train.dist      all-reduce of normalisers, gradients (SUM) and figures
    srtcli.train.precision the forwards' bf16 autocast, where `--mixed-precision` asks for it
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from srtcli.train import dist
from srtcli.train.data import WorkRow, micro_batches, split_ranks
from srtcli.train.logprobs import micro_tensors
from srtcli.train.loss import LossConfig, LossStats, Normalizers, batch_loss, count_normalizers
from srtcli.train.precision import autocast


@dataclass
class StepResult:
    """Global figures of one optimizer step's batch (summed over micro-batches and ranks)."""

    stats: LossStats
    norm: Normalizers
    tokens: int
    packed_tokens: int
    seqs: int


def step_gradients(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    batch: list[WorkRow],
    loss_cfg: LossConfig,
    micro_tokens: int,
    info: dist.DistInfo,
    attn: str = "sdpa",
    fsdp: bool = False,
    compute_dtype: torch.dtype | None = None,
) -> StepResult:
    """Accumulate the global batch's gradient into `.grad` (summed over ranks); the forwards
    run under autocast to `compute_dtype` when one is given (srtcli.train.precision)."""
    mine = split_ranks(batch, info.world)[info.rank]
    local = count_normalizers([s.loss_mask for r in mine for s in r.seqs])
    # the normalisers must be global: a rank dividing by its own counts would weight its
    # tokens differently from the single-process run
    tokens, seqs = dist.all_reduce_sum(info, [local.tokens, local.seqs])
    norm = Normalizers(tokens, seqs)
    mbs = micro_batches(mine, micro_tokens)
    stats = _accumulate(model, ref_model, batch, mbs, loss_cfg, norm, info, attn, fsdp, compute_dtype)
    if not fsdp:
        dist.sum_gradients(info, [p for p in model.parameters() if p.requires_grad])
    counts = [sum(r.tokens for r in mine), sum(r.packed_tokens for r in mine), sum(len(r.seqs) for r in mine)]
    total = dist.all_reduce_sum(info, stats.as_list() + counts)
    return StepResult(LossStats.from_list(total[:5]), norm, int(total[5]), int(total[6]), int(total[7]))


def _accumulate(model: torch.nn.Module, ref_model: torch.nn.Module | None, batch: list[WorkRow],
                mbs: list[list[WorkRow]], loss_cfg: LossConfig, norm: Normalizers, info: dist.DistInfo,
                attn: str, fsdp: bool, compute_dtype: torch.dtype | None = None) -> LossStats:
    """Forward and backward of this rank's micro-batches; their summed loss figures."""
    stats = LossStats()
    n = len(mbs)
    fwd, ref_fwd, spare = model, ref_model, None
    if fsdp:  # the same number of forwards on every rank; see srtcli.train.fsdp
        from srtcli.train.fsdp import RootForward, set_sync

        n = int(dist.all_reduce_max(info, n))
        spare = [min(batch, key=lambda r: r.cost)]
        fwd, ref_fwd = RootForward(model), (RootForward(ref_model) if ref_model is not None else None)
    for i in range(n):
        real = i < len(mbs)
        if fsdp:
            set_sync(model, i == n - 1)
        with autocast(compute_dtype, info.device):
            t, ref_lp = micro_tensors(fwd, ref_fwd, mbs[i] if real else spare, info.device, attn, loss_cfg.temperature)
        share, st = batch_loss(t.lp, t.old, t.adv, t.mask, ref_lp, loss_cfg, norm)
        scale = (info.world if fsdp else 1) * (1.0 if real else 0.0)
        (share * scale if scale != 1 else share).backward()
        if real:
            stats.add(st)
    return stats


def step_record(step: int, epoch: int, lr: float, res: StepResult, grad_norm: float, secs: float) -> dict[str, Any]:
    """One metrics.jsonl line: the step's global figures, per-token means and speed."""
    toks = max(res.stats.tokens, 1.0)
    return {
        "step": step,
        "epoch": epoch,
        "lr": lr,
        "loss": res.stats.loss,
        "clip_frac": res.stats.clipped / toks,
        "kl": res.stats.kl / toks,
        "ratio_mean": res.stats.ratio / toks,
        "grad_norm": grad_norm,
        "trained_tokens": int(res.stats.tokens),
        "seqs": res.seqs,
        "tokens": res.tokens,
        "packed_tokens": res.packed_tokens,
        "token_ratio": res.packed_tokens / max(res.tokens, 1),
        "step_s": secs,
        "tokens_per_s": res.tokens / max(secs, 1e-9),
    }
