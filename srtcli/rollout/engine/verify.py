"""Lossless speculative verification of a batch of draft chains against the target's p.

Row r of a batch carries a draft x_1..x_d (d = draft_len[r], possibly 0) and the shaped target
distributions p_0..p_d from ONE forward (p_k is the next-token distribution after the context
plus x_1..x_k). Verification walks the chain and emits the accepted drafts plus exactly one more
token, so every emitted token is distributed exactly as plain sampling from p would give it.

Two exact schemes, chosen per row by how the draft was made:

- point mass (`sampled[r]` False): the drafter picked x deterministically (the most frequent
  child, a prompt-lookup match). Then the proposal is a point mass on x: accept with
  probability p(x); on rejection sample from p with x removed, renormalised.
- ratio (`sampled[r]` True): the drafter *sampled* x from a distribution q (the tree's child
  frequencies). Accept with min(1, p(x)/q(x)); on rejection sample from (p - q)+.

The point-mass rule is exact for any draft fixed before verification (however it was chosen);
the ratio rule is exact only when x really was sampled from q. The seed's mix, the ratio rule
with a deterministic most-frequent-child draft and q = the child frequencies C, is biased;
tests/srtcli/rollout/engine/test_verify.py shows a chi-square test catching it. When x ~ q the ratio rule
accepts with probability sum_x min(p, q) per position, the point mass only p(x).

Greedy decoding needs no special case: p is a point mass on the argmax, so a draft is accepted
iff it equals the argmax and the emitted token is always the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from srtcli.rollout.engine.sampling import sample


@dataclass
class Verdict:
    """Per row: how many draft tokens were accepted, and the one token emitted after them."""

    accepted: torch.Tensor  # [b] long
    final: torch.Tensor  # [b] long


def verify_drafts(
    p: torch.Tensor,
    draft: torch.Tensor,
    draft_len: torch.Tensor,
    generator: torch.Generator | None = None,
    sampled: torch.Tensor | None = None,
    q_token: torch.Tensor | None = None,
    q_dist: "torch.Tensor | Callable[[list[int]], torch.Tensor] | None" = None,
) -> Verdict:
    """Verify drafts. p: [b, K, V] shaped target probs (row r uses positions 0..d_r);
    draft: [b, K-1] token ids (padding ignored); draft_len: [b]; sampled: [b] bool, rows
    whose drafts were sampled from q; q_token: [b, K-1] q(x_k) for those rows;
    q_dist: [b, K-1, V] their full proposal distributions (for the residual), or a function
    that, given each row's rejection position, returns just those rows [b, V] (the engine
    builds only what a rejection needs)."""
    b, k_max, _ = p.shape
    rows = torch.arange(b, device=p.device)
    n = k_max - 1
    if n > 0:
        px = p[:, :n].gather(-1, draft[:, :n, None]).squeeze(-1)
        accept_p = px
        if sampled is not None and bool(sampled.any()):
            ratio = torch.clamp(px / q_token.clamp_min(1e-30), max=1.0)
            accept_p = torch.where(sampled[:, None], ratio, px)
        u = torch.rand((b, n), generator=generator, device=p.device)
        in_draft = torch.arange(n, device=p.device)[None, :] < draft_len[:, None]
        ok = (u < accept_p) & in_draft
        accepted = ok.long().cumprod(-1).sum(-1)
    else:
        accepted = torch.zeros(b, dtype=torch.long, device=p.device)
    dist = p[rows, accepted].clone()
    rejected = accepted < draft_len
    if bool(rejected.any()):
        at = accepted.clamp(max=max(n - 1, 0))
        x = draft[rows, at] if n > 0 else torch.zeros_like(accepted)
        point = dist.clone()
        point[rows, x] = 0.0
        residual = point
        if sampled is not None and bool(sampled.any()):
            q_at = q_dist(at.tolist()) if callable(q_dist) else q_dist[rows, at]
            ratio_res = (dist - q_at).clamp_min(0.0)
            residual = torch.where(sampled[:, None], ratio_res, point)
        # A residual of (numerically) zero mass only happens when p(x) was ~1 and the
        # uniform draw still fell above it; p itself is then the right fallback.
        good = residual.sum(-1) > 1e-12
        use_res = rejected & good
        dist = torch.where(use_res[:, None], residual, dist)
    final = sample(dist, generator)
    return Verdict(accepted=accepted, final=final)
