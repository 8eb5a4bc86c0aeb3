"""`srtcli.rollout.engine.sampling.sample`: the one-token draw every decode and verification step makes.

A chi-square test at a fixed seed against the exact distribution, on unnormalised rows with
zero-probability tokens at both ends and in the middle; a sampler that forgets to scale u by
the row's total (a plausible slip with unnormalised residuals) must fail the same test.
"""

from __future__ import annotations

import torch

from srtcli.rollout.engine.sampling import sample
from tests.srtcli.rollout.engine.test_verify import p_value

N = 60_000
ROW = torch.tensor([0.0, 0.5, 0.0, 1.25, 0.25, 0.5, 0.0])  # total 2.5


def draws(sampler, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.bincount(sampler(ROW.expand(N, -1), g), minlength=ROW.numel()).double()


def test_draws_follow_the_normalised_row():
    counts = draws(sample)
    assert counts[ROW == 0].sum() == 0
    assert p_value(counts, ROW / ROW.sum()) > 1e-3


def test_a_sampler_that_ignores_the_total_fails_the_same_test():
    def wrong(probs, g):
        cdf = probs.double().cumsum(-1)
        u = torch.rand((probs.shape[0], 1), generator=g, dtype=torch.float64)
        return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)

    assert p_value(draws(wrong), ROW / ROW.sum()) < 1e-6


def test_a_u_at_the_very_top_takes_the_last_token_of_positive_probability(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones((1, 1), dtype=torch.float64))
    assert int(sample(ROW[None])) == 5


def test_a_point_mass_is_always_its_token_and_shapes_are_kept():
    g = torch.Generator().manual_seed(1)
    p = torch.zeros(4, 3, 10)
    p[..., 7] = 1.0
    out = sample(p, g)
    assert out.shape == (4, 3) and bool((out == 7).all())
