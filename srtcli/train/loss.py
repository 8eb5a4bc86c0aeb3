"""The training objective: PPO-clip on trained tokens, optional k3 KL, and loss aggregation.

Per trained token t of a sequence with advantage A (new log-prob `lp`, sampling log-prob
`old`, reference log-prob `ref`):

    ratio = exp(lp - old)
    pg    = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))      (PPO-clip, as a loss)
    kl    = exp(ref - lp) - (ref - lp) - 1                            (k3, >= 0)
    loss  = pg + kl_coef * kl

Aggregation over the *global* batch of one optimizer step (all micro-batches, all ranks):

    token-mean           sum of all token losses / number of trained tokens
    seq-mean-token-sum   sum over sequences of (sum of its token losses) / number of sequences
    seq-mean-token-mean  sum over sequences of (mean of its token losses) / number of sequences

"Sequences" are the steps with at least one trained token. Every sequence is its own term,
even when packing shares its tokens with other sequences: a token trained in two sequences
counts twice, once with each sequence's advantage.

All three are sums of per-sequence terms divided by a global count (`Normalizers`), so the
loss of a micro-batch computed with the global counts is its exact share: summing shares
over micro-batches and ranks (gradient accumulation, all-reduce SUM) gives the full-batch
loss and gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


@dataclass(frozen=True)
class LossConfig:
    clip: float = 0.2
    kl_coef: float = 0.0
    agg: str = "token-mean"
    temperature: float = 1.0  # log-probs of softmax(logits / T): the distribution the rollout sampled

    def __post_init__(self) -> None:
        if self.agg not in AGG_MODES:
            raise ValueError(f"unknown loss aggregation {self.agg!r} (one of {', '.join(AGG_MODES)})")


@dataclass(frozen=True)
class Normalizers:
    """Global counts of one optimizer-step batch: trained tokens and trained sequences."""

    tokens: float
    seqs: float


@dataclass
class LossStats:
    """Sums over trained tokens, for metrics; add them up over micro-batches and ranks."""

    loss: float = 0.0  # this share of the aggregated loss
    tokens: float = 0.0
    clipped: float = 0.0
    kl: float = 0.0
    ratio: float = 0.0

    def add(self, other: "LossStats") -> None:
        self.loss += other.loss
        self.tokens += other.tokens
        self.clipped += other.clipped
        self.kl += other.kl
        self.ratio += other.ratio

    def as_list(self) -> list[float]:
        return [self.loss, self.tokens, self.clipped, self.kl, self.ratio]

    @classmethod
    def from_list(cls, v: list[float]) -> "LossStats":
        return cls(*v)


def token_losses(
    lp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    ref: torch.Tensor | None,
    cfg: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token (loss, clipped, kl, ratio), all shaped like `lp`; `adv` broadcasts."""
    ratio = torch.exp(lp - old)
    pg_plain = -adv * ratio
    pg_clip = -adv * torch.clamp(ratio, 1.0 - cfg.clip, 1.0 + cfg.clip)
    pg = torch.maximum(pg_plain, pg_clip)
    clipped = (pg_clip > pg_plain).to(lp.dtype)
    if ref is None:
        kl = torch.zeros_like(lp)
    else:
        d = ref - lp
        kl = torch.exp(d) - d - 1.0
    loss = pg + cfg.kl_coef * kl if cfg.kl_coef else pg
    return loss, clipped, kl, ratio


def aggregate(loss: torch.Tensor, mask: torch.Tensor, cfg: LossConfig, norm: Normalizers) -> torch.Tensor:
    """This batch's share of the global aggregated loss; `loss`, `mask`: [n_seqs, n_tokens]."""
    seq_sum = (loss * mask).sum(-1)
    if cfg.agg == "token-mean":
        return seq_sum.sum() / max(norm.tokens, 1.0)
    if cfg.agg == "seq-mean-token-sum":
        return seq_sum.sum() / max(norm.seqs, 1.0)
    n = mask.sum(-1)
    per_seq = torch.where(n > 0, seq_sum / n.clamp(min=1.0), torch.zeros_like(seq_sum))
    return per_seq.sum() / max(norm.seqs, 1.0)


def batch_loss(
    lp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    ref: torch.Tensor | None,
    cfg: LossConfig,
    norm: Normalizers,
) -> tuple[torch.Tensor, LossStats]:
    """The loss share of sequences laid out as [n_seqs, n_tokens] (padding has mask 0).

    `adv` is [n_seqs] (one value per sequence); returns (differentiable share, stats).
    """
    off = mask == 0
    mask = mask.to(lp.dtype)
    # untrained and padded slots may hold anything; pin them to 0 *before* exp so that neither
    # the value nor the gradient (0 * inf = nan) can leak out of them
    lp = lp.masked_fill(off, 0.0)
    old = old.to(lp.dtype).masked_fill(off, 0.0)
    ref = None if ref is None else ref.to(lp.dtype).masked_fill(off, 0.0)
    loss, clipped, kl, ratio = token_losses(lp, old, adv.to(lp.dtype)[:, None], ref, cfg)
    share = aggregate(loss, mask, cfg, norm)
    with torch.no_grad():
        stats = LossStats(
            loss=float(share.detach()),
            tokens=float(mask.sum()),
            clipped=float((clipped * mask).sum()),
            kl=float((kl * mask).sum()),
            ratio=float((ratio * mask).sum()),
        )
    return share, stats


def count_normalizers(masks: list[list[int]]) -> Normalizers:
    """Local counts from loss masks (one per sequence); all-reduce them before use."""
    tokens = sum(sum(m) for m in masks)
    seqs = sum(1 for m in masks if any(m))
    return Normalizers(float(tokens), float(seqs))
