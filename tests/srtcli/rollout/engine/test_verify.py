"""Exactness of speculative verification on explicit distributions (cheap, strong), and of the
distribution shaping against transformers' own logits processors.

Every test batches many independent rows through `verify_drafts` at once and compares the
emitted tokens with the target p by a chi-square test at a fixed seed. The deliberately wrong
mix (the ratio rule with a deterministic draft and q = the tree's child frequencies, as the
design seed proposed) must fail the same test, and so must sampling p (not the residual)
where a draft drew "stop".
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from srtcli.rollout.engine.sampling import SamplingParams, shape_probs
from srtcli.rollout.engine.verify import verify_drafts

N = 60_000
P0 = torch.tensor([0.10, 0.45, 0.05, 0.30, 0.10])
P1 = torch.tensor([0.25, 0.05, 0.40, 0.10, 0.20])
C0 = torch.tensor([0.05, 0.15, 0.00, 0.80, 0.00])  # a tree's child frequencies, unlike P0
Q0 = torch.tensor([0.02, 0.40, 0.00, 0.20, 0.00])  # a defective q (mass 0.62): the rest is "stop"


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value (cells with zero expected mass must be empty)."""
    n = counts.sum()
    expected = probs * n
    if bool(((expected == 0) & (counts > 0)).any()):
        return 0.0
    keep = expected > 0
    stat = (((counts - expected) ** 2)[keep] / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat.double() / 2.0))


def run_chain(draft_tok: torch.Tensor, q_tok=None, q_dist=None, seed: int = 0):
    """Verify a 1-token draft per row against p = (P0, P1), as a point mass unless q is given;
    returns emitted first tokens, and the second emitted token of the rows whose first draft
    was accepted."""
    g = torch.Generator().manual_seed(seed)
    p = torch.stack([P0, P1])[None].expand(N, 2, 5).contiguous()
    draft = draft_tok[:, None]
    v = verify_drafts(p, draft, torch.ones(N, dtype=torch.long), g, q_tok, q_dist)
    first = torch.where(v.accepted == 1, draft_tok, v.final)
    return first, v.final[v.accepted == 1]


def counts(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=5).double()


def test_point_mass_with_a_deterministic_draft_is_exact():
    draft = torch.full((N,), 3)  # the most frequent child of C0, always
    first, second = run_chain(draft)
    assert p_value(counts(first), P0) > 1e-3
    assert p_value(counts(second), P1) > 1e-3
    assert 0.28 < (first == 3).double().mean() < 0.32


def test_ratio_rule_with_a_draft_sampled_from_q_is_exact():
    g = torch.Generator().manual_seed(1)
    draft = torch.multinomial(C0, N, replacement=True, generator=g)
    q_tok = C0[draft][:, None]
    q_dist = C0.expand(N, 1, 5).contiguous()
    first, second = run_chain(draft, q_tok=q_tok, q_dist=q_dist)
    assert p_value(counts(first), P0) > 1e-3
    assert p_value(counts(second), P1) > 1e-3


def test_the_seeds_mix_c_as_q_with_greedy_drafts_is_caught():
    draft = torch.full((N,), 3)
    q_tok = C0[draft][:, None]
    q_dist = C0.expand(N, 1, 5).contiguous()
    first, _ = run_chain(draft, q_tok=q_tok, q_dist=q_dist)
    assert p_value(counts(first), P0) < 1e-6


def stop_drafts(seed: int = 1):
    """Per row, one draw from Q0 plus its stop mass: a 1-token draft, or a stop at position 0
    (draft length 0, Q0 still the proposal there)."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.multinomial(torch.cat([Q0, 1 - Q0.sum(0, keepdim=True)]), N, replacement=True, generator=g)
    stopped = pick == 5
    draft = pick.clamp(max=4)
    return draft, stopped


def run_stops(draft, stopped, q_at_stop: torch.Tensor, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.stack([P0, P1])[None].expand(N, 2, 5).contiguous()
    q_dist = torch.where(stopped[:, None, None], q_at_stop, Q0).expand(N, 1, 5).contiguous()
    v = verify_drafts(p, draft[:, None], (~stopped).long(), g, Q0[draft][:, None], q_dist)
    return torch.where(v.accepted == 1, draft, v.final)


def test_a_draft_that_drew_stop_samples_the_residual_and_is_exact():
    draft, stopped = stop_drafts()
    first = run_stops(draft, stopped, Q0)
    assert p_value(counts(first), P0) > 1e-3
    assert 0.35 < stopped.double().mean() < 0.41


def test_sampling_p_after_a_stop_is_caught():
    # the wrong variant: a stop treated as "no draft here", so the token comes from p itself
    draft, stopped = stop_drafts()
    first = run_stops(draft, stopped, torch.zeros(5))
    assert p_value(counts(first), P0) < 1e-6


def test_point_mass_rule_is_exact_whatever_chose_the_draft():
    # accept x w.p. p(x), else sample p without x: exact for any x fixed before verification,
    # including a sampled one (it then just accepts less than the ratio rule would)
    g = torch.Generator().manual_seed(1)
    draft = torch.multinomial(C0, N, replacement=True, generator=g)
    first, second = run_chain(draft)
    assert p_value(counts(first), P0) > 1e-3
    assert p_value(counts(second), P1) > 1e-3


def test_greedy_accepts_only_the_argmax_and_emits_it():
    p = shape_probs(torch.log(torch.stack([P0, P1]))[None].expand(4, 2, 5), SamplingParams(temperature=0))
    draft = torch.tensor([[1], [3], [0], [1]])
    v = verify_drafts(p, draft, torch.tensor([1, 1, 1, 0]), torch.Generator().manual_seed(0))
    assert v.accepted.tolist() == [1, 0, 0, 0]
    assert v.final.tolist() == [2, 1, 1, 1]


def test_mixed_rows_and_ragged_draft_lengths_in_one_batch():
    # rows with 0, 1 and 2 draft tokens; the emitted first token must follow P0 in each group
    g = torch.Generator().manual_seed(3)
    p = torch.stack([P0, P1, P0])[None].expand(N, 3, 5).contiguous()
    draft = torch.tensor([[3, 2]]).expand(N, 2).contiguous()
    dlen = torch.arange(N) % 3
    v = verify_drafts(p, draft, dlen, g)
    first = torch.where((v.accepted >= 1), draft[:, 0], v.final)
    for d in range(3):
        assert p_value(counts(first[dlen == d]), P0) > 1e-3
    both = (dlen == 2) & (v.accepted >= 1)
    second = torch.where(v.accepted[both] == 2, draft[both, 1], v.final[both])
    assert p_value(counts(second), P1) > 1e-3


def hf_shape(logits: torch.Tensor, t: float, k: int, p: float) -> torch.Tensor:
    ids = torch.zeros((logits.shape[0], 1), dtype=torch.long)
    x = TemperatureLogitsWarper(t)(ids, logits.clone())
    if k:
        x = TopKLogitsWarper(k)(ids, x)
    if p < 1.0:
        x = TopPLogitsWarper(p)(ids, x)
    return torch.softmax(x, -1)


def test_shaping_matches_transformers_processors():
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    for t, k, p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 10, 1.0), (1.0, 0, 0.8), (0.5, 20, 0.9), (1.0, 1, 1.0)]:
        ours = shape_probs(logits, SamplingParams(temperature=t, top_k=k, top_p=p))
        torch.testing.assert_close(ours, hf_shape(logits, t, k, p), atol=1e-6, rtol=1e-5)
    wrong = shape_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))  # order matters
    assert not torch.allclose(wrong, hf_shape(logits, 0.5, 20, 0.9))


def test_the_engines_list_form_gives_the_tensor_forms_verdicts():
    # verify_chains (proposals as lists, the residual built only for rejecting rows) must draw
    # exactly what verify_drafts draws for the same batch: point-mass rows there are q(x) = 1
    # with a one-hot proposal distribution; stopped rows carry their last q past the draft
    from srtcli.rollout.drafters.base import Proposal
    from srtcli.rollout.engine.forward import kept_starts
    from srtcli.rollout.engine.target import Target
    from srtcli.rollout.engine.verify import verify_chains

    gen = torch.Generator().manual_seed(5)
    b, n, vocab = 64, 3, 5
    p = torch.softmax(torch.randn(b, n + 1, vocab, generator=gen) * 2, -1)
    props, q_tok, q_dist = [], torch.ones(b, n), torch.zeros(b, n, vocab)
    for r in range(b):
        d = r % (n + 1)
        toks = torch.randint(0, vocab, (d,), generator=gen).tolist()
        if r % 2:  # sampled from a known q; some stopped, with a q of mass 0.6 after the last token
            stop = r % 3 == 0 and d < n
            mass = [1.0] * d + [0.6] * stop
            dists = [dict(enumerate((m * torch.softmax(torch.randn(vocab, generator=gen), -1)).tolist())) for m in mass]
            props.append(Proposal(toks, [dist[t] for dist, t in zip(dists, toks)], dists))
            for k, dist in enumerate(dists):
                q_tok[r, k] = dist[toks[k]] if k < d else 1.0
                q_dist[r, k] = torch.tensor([dist[v] for v in range(vocab)])
        else:
            props.append(Proposal(toks))
            for k, t in enumerate(toks):
                q_dist[r, k, t] = 1.0
    draft = torch.tensor([pr.tokens + [0] * (n - len(pr.tokens)) for pr in props])
    dlen = torch.tensor([len(pr.tokens) for pr in props])
    # the engine's form of the same p: each row's kept positions p_0 .. p_d, as logits
    kept = torch.cat([p[r, : len(pr.tokens) + 1] for r, pr in enumerate(props)]).log()
    target = Target(kept, kept_starts([len(pr.tokens) for pr in props]), SamplingParams(1.0))
    for seed in range(20):
        v = verify_drafts(p, draft, dlen, torch.Generator().manual_seed(seed), q_tok, q_dist)
        acc, emitted, lps = verify_chains(target, props, torch.Generator().manual_seed(seed), torch.device("cpu"))
        assert acc == v.accepted.tolist()
        assert [e[-1] for e in emitted] == v.final.tolist()
        assert [e[:a] for e, a in zip(emitted, acc)] == [pr.tokens[:a] for pr, a in zip(props, acc)]
        want = [[float(p[r, k, t].log()) for k, t in enumerate(e)] for r, e in enumerate(emitted)]
        assert all(torch.allclose(torch.tensor(x), torch.tensor(y)) for x, y in zip(lps, want))
