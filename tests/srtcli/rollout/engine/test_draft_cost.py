"""The cost rule (`DraftCost`): a forward's cost fitted from timings, acceptance learned from
verdicts, and the cut that keeps the draft tokens expected to save time, exactly.

The cut's exactness is checked as verification's is (tests/srtcli/rollout/engine/test_verify.py):
many rows at once against an explicit p, by a chi-square test at a fixed seed. Cutting by a
confidence known before the draw keeps the output exact; cutting by the drawn token's own
probability (keep the likely draws) is biased and fails the same test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from srtcli.rollout.drafters.srt import concentration
from srtcli.rollout.engine.draft_cost import (MIN_FORWARDS, PREMIUM_SE, WINDOW, Acceptance, DraftCost, ForwardCost,
                                              chain_products)
from srtcli.rollout.engine.verify import verify_drafts
from tests.srtcli.rollout.engine.test_verify import P0, p_value


def fitted(a: float, b: float, c: float = 0.0, d: float | None = None, tokens=range(1, 65), contexts=(50, 400),
           drafted=(0, 8)) -> ForwardCost:
    """A cost fitted to forwards of n rows' tokens and m draft tokens over context k that took
    exactly a + b * n + d * m + c * (n + m) * k (a draft token costing what a row's does unless
    `d` says otherwise)."""
    d = b if d is None else d
    cost = ForwardCost()
    forwards = list(itertools.product(tokens, contexts, drafted))
    for i in np.random.default_rng(0).permutation(len(forwards)):  # every kind among the recent ones
        n, k, m = forwards[i]
        cost.observe(n + m, k, a + b * n + d * m + c * (n + m) * k, drafted=m)
    return cost


def with_cost(forward: ForwardCost) -> DraftCost:
    rule = DraftCost()
    rule.forward = forward
    return rule


def test_the_fitted_cost_is_the_forwards_own():
    # within 1%: the fit holds slopes a little towards 0 (RIDGE), so an unseen one stays near it
    cost = fitted(0.05, 0.001, 2e-6, d=0.003)
    assert cost.draft_token(100)[0] == pytest.approx(0.003 + 2e-4, rel=0.01)
    assert cost.per_draft_token(100) == pytest.approx(0.003 + 2e-4, rel=0.01)  # no noise: no premium
    assert cost.predict(40, 300) == pytest.approx(0.05 + 0.04 + 2e-6 * 40 * 300, rel=0.01)
    assert cost.predict(40, 300, drafted=10) == pytest.approx(0.05 + 0.03 + 0.03 + 2e-6 * 40 * 300, rel=0.01)


def test_recent_forwards_weigh_most():
    cost = fitted(0.05, 0.001)
    for n in range(1, 65):  # the device got slower per token: two half-lives of forwards
        for m in (0, 8):
            cost.observe(n + m, 50, 0.05 + 0.003 * (n + m), drafted=m)
    assert 0.0022 < cost.draft_token(50)[0] < 0.0031  # nearer the new 0.003 than the old 0.001


def test_a_cost_no_forward_has_shown_is_taken_as_zero():
    # every forward verified 32 rows' tokens and no draft: nothing says what a draft token
    # costs, so the rule drafts (and its forwards then show it); a noisy negative slope is no
    # reason to draft more either
    flat = fitted(0.1, 0.002, tokens=[32] * 4, contexts=(80,), drafted=(0,))
    assert flat.per_draft_token(80) < 1e-9
    assert with_cost(flat).worth_drafting(rows=32, tokens=32, context=80)
    falling = fitted(0.1, -0.001, contexts=(0,))
    assert falling.draft_token(0)[0] == 0.0


def test_a_draft_token_is_priced_above_its_fit_while_few_noisy_forwards_show_it():
    rng = np.random.default_rng(0)
    cost = ForwardCost()

    def time(forwards: int) -> None:  # 32 rows and 0-8 draft tokens, a draft token 4 ms, +-10% noise
        for m in rng.integers(0, 9, forwards):
            cost.observe(32 + int(m), 200, (0.15 + 0.004 * m) * rng.uniform(0.9, 1.1), drafted=int(m))

    time(MIN_FORWARDS)
    early, early_error = cost.draft_token(200)
    assert early_error > 0.001
    assert cost.per_draft_token(200) == pytest.approx(early + PREMIUM_SE * early_error)
    time(WINDOW)
    late, late_error = cost.draft_token(200)
    assert late_error < early_error / 2 and abs(late - 0.004) < 2 * late_error + 1e-4


def test_a_fit_below_zero_still_predicts_a_positive_time():
    cost = fitted(-0.01, 0.001, tokens=range(20, 65), contexts=(0,))
    assert cost.predict(1, 0) > 0
    # such a fit says a forward is all per-token cost: no draft token pays (and nothing divides by 0)
    assert with_cost(cost).cut(1, 1, 0, [[0.9, 0.9]]) == [0]


def test_until_enough_forwards_are_timed_every_draft_is_verified():
    rule = DraftCost()
    for _ in range(MIN_FORWARDS - 1):
        rule.observe_forward(32, 100, 1.0)  # would make any draft too dear
    assert rule.worth_drafting(32, 32, 100)
    assert rule.cut(32, 32, 100, [[0.1] * 4, [0.2] * 2]) == [4, 2]


def test_acceptance_is_learned_by_confidence_and_depth():
    acc = Acceptance()
    rng = np.random.default_rng(0)
    conf = rng.choice([0.2, 0.6, 0.995], 20_000)
    depth = rng.integers(0, 5, 20_000)
    rate = np.where(depth == 0, conf * 0.8, np.minimum(1.0, conf + 0.1))
    acc.observe(conf, depth, rng.random(20_000) < rate)
    got = acc.expected(np.array([0.2, 0.6, 0.995, 0.2, 0.995]), np.array([0, 0, 0, 3, 7]))
    np.testing.assert_allclose(got, [0.16, 0.48, 0.796, 0.3, 1.0], atol=0.03)
    assert abs(acc.best_first() - 0.796) < 0.03


def test_a_depth_without_verdicts_expects_what_the_depth_above_it_showed():
    # confident first tokens accepted 0.7 of the time: an unseen deeper one is not taken at its
    # confidence (0.995) but at what its bin showed one depth up
    acc = Acceptance()
    acc.observe(np.full(1000, 0.995), np.zeros(1000, int), np.arange(1000) < 700)
    np.testing.assert_allclose(acc.expected(np.array([0.995, 0.995, 0.995]), np.array([0, 1, 3])), 0.7, atol=0.01)


def test_chain_products_restart_at_every_chain():
    got = chain_products(np.array([0.5, 0.5, 0.9, 1.0, 0.2]), np.array([2, 0, 3]))
    np.testing.assert_allclose(got, [0.5, 0.25, 0.9, 0.9, 0.18])


def learned(forward: ForwardCost) -> DraftCost:
    """The rule with `forward`'s cost, having seen draft tokens accepted at their confidence."""
    rule = with_cost(forward)
    for conf in (0.2, 0.6, 0.9):
        n = 1000
        rule.observe_verdicts([[conf]] * n, [1] * int(conf * n) + [0] * (n - int(conf * n)))
    return rule


def test_the_cut_keeps_tokens_by_their_chance_while_the_rate_rises():
    confs = [[0.9, 0.9, 0.9], [0.6, 0.6], [0.2]]
    # a forward whose cost does not move with its tokens: every token pays
    assert learned(fitted(0.1, 0.0)).cut(3, 3, 50, confs) == [3, 2, 1]
    # a forward whose every token costs what a row does: no token that may be rejected pays
    steep = learned(fitted(0.0, 0.01))
    assert steep.cut(3, 3, 50, confs) == [0, 0, 0]
    assert not steep.worth_drafting(3, 3, 50)
    # in between: the likeliest first (the first chain), each chain cut to a prefix
    mid = learned(fitted(0.03, 0.005))
    assert mid.cut(3, 3, 50, confs) == [3, 1, 0]
    assert mid.worth_drafting(3, 3, 50)


def test_a_draft_token_is_priced_at_its_own_cost_not_a_rows():
    confs = [[0.9, 0.9, 0.9], [0.6, 0.6], [0.2]]
    # rows' tokens cost nothing more, draft tokens (their verification) dearly: none pays
    dear = learned(fitted(0.1, 0.0, d=0.05))
    assert dear.cut(3, 3, 50, confs) == [0, 0, 0]
    assert not dear.worth_drafting(3, 3, 50)
    # rows' tokens cost dearly, draft tokens nothing more: every one pays
    assert learned(fitted(0.1, 0.05, d=0.0)).cut(3, 3, 50, confs) == [3, 2, 1]


def test_a_drawn_stop_competes_like_a_token():
    # a chain of 1 token that then drew its stop carries 2 confidences: keeping both keeps the stop
    rule = with_cost(fitted(0.1, 0.0))
    assert rule.cut(2, 2, 50, [[0.995, 0.9], [0.995]]) == [2, 1]


# -- exactness of the cut ---------------------------------------------------------------------

N = 60_000
# the drafts' distributions: each row draws its one draft token from one of these, confident
# ones and vague ones
QS = torch.tensor([[0.00, 0.90, 0.00, 0.10, 0.00],
                   [0.20, 0.20, 0.20, 0.20, 0.20],
                   [0.00, 0.50, 0.00, 0.50, 0.00],
                   [0.40, 0.00, 0.00, 0.60, 0.00]])


def cut_and_verify(peek: bool, seed: int = 0) -> torch.Tensor:
    """Each row drafts one token from its q, the cost rule cuts the drafts (judging a row by the
    concentration of its q, or with `peek` by the drawn token's own q), and verification emits
    one token per row; the counts of the emitted tokens."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.randint(0, len(QS), (N,), generator=g)
    q = QS[kind]
    u = torch.rand(N, generator=g)
    cdf = q.cumsum(-1)
    draft = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(-1).clamp(max=4)
    q_x = q[torch.arange(N), draft]
    confs = [[float(x)] if peek else [concentration(dict(enumerate(QS[k].tolist())))]
             for k, x in zip(kind.tolist(), q_x.tolist())]
    # a forward whose fixed part costs what its rows do: some draft tokens pay, some do not
    cuts = torch.tensor(with_cost(fitted(N, 1.0, contexts=(0,))).cut(N, N, 0, confs))
    assert 0.2 * N < int(cuts.sum()) < 0.9 * N
    p = P0.expand(N, 2, 5)
    kept = (cuts > 0)[:, None, None]  # a cut row verifies no draft: p is sampled there
    v = verify_drafts(p, draft[:, None], cuts, g, q_x[:, None], q[:, None] * kept)
    out = torch.where(v.accepted > 0, draft, v.final)
    return torch.bincount(out, minlength=5).double()


def test_a_cut_by_what_was_known_before_the_draw_is_exact():
    assert p_value(cut_and_verify(peek=False), P0.double()) > 1e-3


def test_a_cut_that_peeks_at_the_drawn_token_is_caught():
    assert p_value(cut_and_verify(peek=True), P0.double()) < 1e-6
