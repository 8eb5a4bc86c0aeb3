"""Lossless speculative verification of a batch of draft chains against the target's p.

Row r of a batch carries a draft x_1..x_d (d = draft_len[r], possibly 0) and the shaped target
distributions p_0..p_d from ONE forward (p_k is the next-token distribution after the context
plus x_1..x_k). Verification walks the chain and emits the accepted drafts plus exactly one more
token, so every emitted token is distributed exactly as plain sampling from p would give it.

One rule, the ratio rule against the distribution q the draft was drawn from: accept x with
probability min(1, p(x)/q(x)); on rejection sample from the residual (p - q)+, renormalised.
How the draft was made decides q:

- sampled (`Proposal.q` set): the drafter drew x from q (the tree's child frequencies); q(x) and
  the distribution at each position come with the draft. This accepts with probability
  sum_x min(p, q) per position.
- deterministic (the most frequent child, a prompt-lookup match): q is a point mass on x, so the
  rule accepts with probability p(x) and the residual is p with x removed. This is exact for
  any draft fixed before verification, however it was chosen.
- stopped: a sampled draft may end by drawing "stop" from a q of mass below 1 (the rest is the
  stop). That is a draft token p never emits, so it is always rejected and the token there is
  sampled from the residual (p - q)+: P(y) = min(p, q)(y) + (1 - sum min(p, q)) (p - q)+(y) / Z
  = p(y), since Z = 1 - sum min(p, q). Sampling p there instead would be biased.

Mixing them is biased: a deterministic most-frequent-child draft verified as if drawn from its
child frequencies C (q = C) fails a chi-square test, which the tests show.

Greedy decoding needs no special case: p is a point mass on the argmax, so a draft is accepted
iff it equals the argmax and the emitted token is always the argmax.

`verify_chains` is the engine's entry (proposals as Python lists, the target's distributions as a
`Target`: p(x) of each draft token, one whole distribution per row, one host sync, and the
residual built only for the rows that rejected); `verify_drafts` is the same rule on tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from srtcli.rollout.engine.host_tensors import floats, longs
from srtcli.rollout.engine.sampling import sample
from srtcli.rollout.engine.target import Target


@dataclass
class Verdict:
    """Per row: how many draft tokens were accepted, and the one token emitted after them."""

    accepted: torch.Tensor  # [b] long
    final: torch.Tensor  # [b] long


def verify_drafts(p: torch.Tensor, draft: torch.Tensor, draft_len: torch.Tensor,
                  generator: torch.Generator | None = None, q_tok: torch.Tensor | None = None,
                  q_dist: torch.Tensor | None = None) -> Verdict:
    """Verify drafts. p: [b, K, V] shaped target probs (row r uses positions 0..d_r);
    draft: [b, K-1] token ids (padding ignored); draft_len: [b]; q_tok: [b, K-1] q(x_k) of
    sampled drafts and q_dist: [b, K-1, V] their proposal distributions (None: every draft is
    a point mass). A sampled row whose q_dist is non-zero at position draft_len ended by
    drawing "stop" from that defective q there."""
    b, kk, vocab = p.shape
    n = kk - 1
    if q_tok is None:
        q_tok = torch.ones(draft.shape, device=p.device)
    beyond = torch.arange(n, device=p.device)[None, :] >= draft_len[:, None]
    px = p[:, :n].gather(-1, draft[..., None]).squeeze(-1)
    accepted = _accepted(px, q_tok.masked_fill(beyond, math.inf), generator)
    rows = torch.arange(b, device=p.device)
    dist = p[rows, accepted]
    rejected = accepted < draft_len
    if q_dist is not None and n:  # a stop drawn at position draft_len: q non-zero there
        stop = q_dist[rows, accepted.clamp(max=n - 1)].sum(-1) > 0
        rejected |= (accepted == draft_len) & (accepted < n) & stop
    rejected = rejected.nonzero().squeeze(-1)
    if len(rejected):
        at = accepted[rejected]
        if q_dist is None:
            q_at = torch.zeros((len(rejected), vocab), device=p.device)
            q_at[torch.arange(len(rejected)), draft[rejected, at]] = 1.0
        else:
            q_at = q_dist[rejected, at]
        dist[rejected] = _residual(dist[rejected], q_at)
    return Verdict(accepted=accepted, final=sample(dist, generator))


def verify_chains(target: Target, props: list[Any], generator: torch.Generator,
                  device: torch.device) -> tuple[list[int], list[list[int]], list[list[float]]]:
    """Verify every row's chain proposal (`Proposal`) against the target distributions of one
    forward (`Target`: p(x) of each draft token, then one whole distribution per row, where it
    stopped accepting). Per row: the accepted draft count a, the emitted tokens (the first a
    accepted drafts, then the final token) and their log-probs under p."""
    b = len(props)
    lens = [len(pr.tokens) for pr in props]
    n = max(lens, default=0)
    px = torch.zeros((b, n), device=device)
    if n:
        flat = longs([r * n + k for r, d in enumerate(lens) for k in range(d)]).to(device)
        idx = longs([target.at(r, k) for r, d in enumerate(lens) for k in range(d)]).to(device)
        toks = longs([t for pr in props for t in pr.tokens]).to(device)
        px.view(-1)[flat] = target.probs_of(idx, toks)
    # q(x) pads with inf past a draft, so no padded position is ever accepted
    q = [x for pr in props for x in (pr.q or [1.0] * len(pr.tokens)) + [math.inf] * (n - len(pr.tokens))]
    accepted = _accepted(px, floats(q).view(b, n).to(device), generator).tolist()
    dist = target.dists(longs([target.at(r, a) for r, a in enumerate(accepted)]).to(device))
    kept = dist
    # a row rejected a draft token, or drew the stop after its last one
    rejected = [r for r, (a, pr) in enumerate(zip(accepted, props))
                if a < len(pr.tokens) or (a == len(pr.tokens) and pr.stopped)]
    if rejected:
        drafts = [pr.tokens + [0] * (n - len(pr.tokens)) for pr in props]
        kept, at = dist.clone(), longs(rejected).to(device)
        q_at = _proposal_at(props, drafts, accepted, rejected, target.vocab, device)
        dist.index_copy_(0, at, _residual(dist.index_select(0, at), q_at))
    final = sample(dist, generator)
    lp_final = kept.gather(1, final[:, None])
    lps = torch.cat([px, lp_final], 1).clamp_min(1e-38).log().tolist()
    fin = final.tolist()
    emitted = [pr.tokens[:a] + [fin[r]] for r, (a, pr) in enumerate(zip(accepted, props))]
    return accepted, emitted, [lp[:a] + [lp[-1]] for lp, a in zip(lps, accepted)]


def _accepted(px: torch.Tensor, q_tok: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """[b] how many leading draft tokens each row accepts, from p(x) and q(x) ([b, n]): one
    uniform draw per position, kept while u < p(x)/q(x) (q = inf past a draft, so never there)."""
    b, n = px.shape
    if n == 0:
        return torch.zeros(b, dtype=torch.long, device=px.device)
    u = torch.rand((b, n), generator=generator, device=px.device)
    return (u < px / q_tok).cumprod(-1).sum(-1)


def _residual(dist: torch.Tensor, q_at: torch.Tensor) -> torch.Tensor:
    """(p - q)+ for rows that rejected (unnormalised; `sample` normalises). A residual of
    (numerically) zero mass only happens when p(x) was ~1 and the uniform draw still fell
    above it; p itself is then the right fallback."""
    res = (dist - q_at).clamp_min_(0.0)
    return torch.where(res.sum(-1, keepdim=True) > 1e-12, res, dist)


def _proposal_at(props: list[Any], drafts: list[list[int]], accepted: list[int], rejected: list[int],
                 vocab: int, device: torch.device) -> torch.Tensor:
    """[len(rejected), V] the proposal distribution q at each rejected row's rejection position:
    the sampled draft's distribution there, or a point mass on the rejected token."""
    ri, ti, vals = [], [], []
    for i, r in enumerate(rejected):
        pr, k = props[r], accepted[r]
        if pr.q is not None:
            dist = pr.dists[k]
            ri += [i] * len(dist)
            ti += dist.keys()
            vals += dist.values()
        else:
            ri.append(i)
            ti.append(drafts[r][k])
            vals.append(1.0)
    q = torch.zeros((len(rejected), vocab))
    q.view(-1)[longs([i * vocab + t for i, t in zip(ri, ti)])] = floats(vals)
    return q.to(device)
