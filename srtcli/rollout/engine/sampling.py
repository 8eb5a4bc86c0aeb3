"""Distribution shaping: temperature, top-k and top-p, applied exactly as plain sampling does.

The engine turns the target model's logits into the *shaped* distribution p with
`shape_probs` and samples (or verifies drafts) against that p, so speculative decoding and
plain sampling see the same distribution. The order is transformers' `generate` order:
temperature, then top-k, then top-p (the smallest set of most likely tokens whose mass reaches
top_p; the first token is always kept). Temperature 0 means greedy: p is a point mass on the
argmax (ties go to the lowest token id, as `torch.argmax`).

`old_logprobs` in the steps pool are `log p(token)` under this shaped p (0.0 for greedy).

`sample` draws one token per row from p by inverting the CDF; on CPU it is 7-25x cheaper than
`torch.multinomial` (121 us vs 17 us for 8 x 646 rows, 441 us for 32 rows), which every decode
step pays once (tree verification draws at every node).
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


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of `probs` ([..., V], non-negative, any positive total), drawn with
    probability p_i / sum(p): the first index whose running sum exceeds u * total, u ~ U[0, 1).
    A token of probability 0 is never drawn: the running sum does not rise at it (a float sum
    of non-negative terms never falls), and a u * total that rounds up to the total, which no
    index exceeds, takes the last token of positive probability."""
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = flat.float().cumsum(-1)
    u = torch.rand((flat.shape[0], 1), generator=generator, device=flat.device)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    over = idx >= flat.shape[-1]
    if bool(over.any()):
        last = (flat[over] > 0).cumsum(-1).argmax(-1)  # the last index of positive probability
        idx[over] = last
    return idx.reshape(probs.shape[:-1])
