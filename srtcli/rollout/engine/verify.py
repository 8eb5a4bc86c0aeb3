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
the ratio rule is exact only when x really was sampled from q: mixing them, the ratio rule with
a deterministic most-frequent-child draft and q = the child frequencies C, is biased (a
chi-square test catches it). When x ~ q the ratio rule accepts with probability
sum_x min(p, q) per position, the point mass only p(x).

Greedy decoding needs no special case: p is a point mass on the argmax, so a draft is accepted
iff it equals the argmax and the emitted token is always the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

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
    accepted = _accepted(p, draft, draft_len, generator, sampled, q_token)
    dist = _final_distribution(p, draft, draft_len, accepted, sampled, q_dist)
    return Verdict(accepted=accepted, final=sample(dist, generator))


def _accepted(p: torch.Tensor, draft: torch.Tensor, draft_len: torch.Tensor, generator: torch.Generator | None,
              sampled: torch.Tensor | None, q_token: torch.Tensor | None) -> torch.Tensor:
    """[b] how many leading draft tokens each row accepts (one uniform draw per position)."""
    b, k_max, _ = p.shape
    n = k_max - 1
    if n <= 0:
        return torch.zeros(b, dtype=torch.long, device=p.device)
    px = p[:, :n].gather(-1, draft[:, :n, None]).squeeze(-1)
    accept_p = px
    if sampled is not None and bool(sampled.any()):
        ratio = torch.clamp(px / q_token.clamp_min(1e-30), max=1.0)
        accept_p = torch.where(sampled[:, None], ratio, px)
    u = torch.rand((b, n), generator=generator, device=p.device)
    in_draft = torch.arange(n, device=p.device)[None, :] < draft_len[:, None]
    ok = (u < accept_p) & in_draft
    return ok.long().cumprod(-1).sum(-1)


def _final_distribution(p: torch.Tensor, draft: torch.Tensor, draft_len: torch.Tensor, accepted: torch.Tensor,
                        sampled: torch.Tensor | None, q_dist: Any) -> torch.Tensor:
    """[b, V] what the one token after the accepted drafts is drawn from: p there, or after a
    rejection the scheme's residual (p without x, or (p - q)+)."""
    b, k_max, _ = p.shape
    rows = torch.arange(b, device=p.device)
    n = k_max - 1
    dist = p[rows, accepted].clone()
    rejected = accepted < draft_len
    if not bool(rejected.any()):
        return dist
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
    return torch.where(use_res[:, None], residual, dist)


def verify_chains(p: torch.Tensor, props: list[Any], generator: torch.Generator,
                  device: torch.device) -> tuple[list[int], list[list[int]], list[list[float]]]:
    """Verify every row's chain proposal (`Proposal`) against p [b, K, V] from one forward.
    Per row: the accepted draft count a, the emitted tokens (the first a + 1 are the accepted
    drafts, then the final token) and their log-probs under p."""
    b, kk, _ = p.shape
    n = kk - 1
    draft, dlen, sampled, q_tok, q_dist = _chain_inputs(props, n, p.shape[-1], device)
    v = verify_drafts(p, draft[:, :n], dlen, generator, sampled, q_tok, q_dist)
    ar = torch.arange(kk, device=device)[None, :]
    padded = torch.cat([draft[:, :n], torch.zeros((b, 1), dtype=torch.long, device=device)], 1)
    emitted = torch.where(ar < v.accepted[:, None], padded, v.final[:, None])
    lps = p.gather(-1, emitted[..., None]).squeeze(-1).clamp_min(1e-38).log()
    return v.accepted.tolist(), emitted.tolist(), lps.tolist()


def _chain_inputs(props: list[Any], n: int, vocab: int, device: torch.device) -> tuple:
    """`verify_drafts`' inputs for the proposals: drafts padded to n, their lengths, which
    were sampled, q of each sampled token, and the proposal distribution at a rejection."""
    draft = torch.zeros((len(props), max(n, 1)), dtype=torch.long)
    dlen = torch.tensor([len(pr.tokens) for pr in props], dtype=torch.long)
    sampled = torch.tensor([pr.q is not None and len(pr.tokens) > 0 for pr in props])
    q_tok = q_dist = None
    if n > 0:
        draft = torch.tensor([pr.tokens + [0] * (n - len(pr.tokens)) for pr in props], dtype=torch.long)
    if bool(sampled.any()):
        q_tok = torch.tensor([(pr.q or []) + [1.0] * (max(n, 1) - len(pr.q or [])) for pr in props])
        q_tok = q_tok.to(device)
        q_dist = partial(_proposal_at, props, vocab, device)
    return draft.to(device), dlen.to(device), sampled.to(device), q_tok, q_dist


def _proposal_at(props: list[Any], vocab: int, device: torch.device, at: list[int]) -> torch.Tensor:
    """[b, V] each sampled row's proposal distribution at its rejection position `at[r]`."""
    ri, ti, vals = [], [], []
    for r, (pr, k) in enumerate(zip(props, at)):
        if pr.q is not None and k < len(pr.tokens):
            dist = pr.dists[k]
            ri += [r] * len(dist)
            ti += dist.keys()
            vals += dist.values()
    q = torch.zeros((len(props), vocab))
    q[ri, ti] = torch.tensor(vals)
    return q.to(device)
