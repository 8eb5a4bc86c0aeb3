"""Distribution shaping: temperature, top-k and top-p, applied exactly as plain sampling does.

The engine turns the target model's logits into the *shaped* distribution p with
`shape_probs` and samples (or verifies drafts) against that p, so speculative decoding and
plain sampling see the same distribution. The order is transformers' `generate` order:
temperature, then top-k, then top-p (the smallest set of most likely tokens whose mass reaches
top_p; the first token is always kept). Temperature 0 means greedy: p is a point mass on the
argmax (ties go to the lowest token id, as `torch.argmax`).

`old_logprobs` in the steps pool are `log p(token)` under this shaped p (0.0 for greedy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How the policy's next-token distribution is shaped before sampling."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def shape_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The shaped distribution over the last axis, in float32 (rows sum to 1)."""
    logits = logits.float()
    if params.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False  # always keep the most likely token
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs
