"""End-to-end sampling exactness on a tiny real model: the distribution of whole continuations
generated with drafting equals the model's own (enumerated exactly), with the adaptive draft
length and under the cost rule, and the naive biased rule (greedy drafts verified with C as q)
fails the same chi-square test, as does sampling p where a draft drew its stop."""

from __future__ import annotations

import itertools

import pytest
import torch

from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.drafters.base import Proposal
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sequence import Sequence
from srtcli.rollout.engine.sampling import SamplingParams
from tests.srtcli.rollout.engine.support import tiny_model
from tests.srtcli.rollout.engine.test_verify import p_value

torch.set_num_threads(1)
V, NEW, N = 5, 3, 3000
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", vocab=V, sharp=6.0, seed=3)


@torch.inference_mode()
def exact(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of NEW tokens, by enumeration."""
    from srtcli.rollout.engine.sampling import shape_probs

    out = {}
    for cont in itertools.product(range(V), repeat=NEW):
        logits = model(torch.tensor([PROMPT + list(cont)], device=model.device)).logits[0]
        p = shape_probs(logits[len(PROMPT) - 1: len(PROMPT) - 1 + NEW], params).cpu()
        out[cont] = float(torch.prod(p[torch.arange(NEW), torch.tensor(cont)]))
    return out


def sample(model, drafter, params, seed=0, groups=1, draft_length="adaptive") -> tuple[dict, Engine]:
    """N continuations of PROMPT; with groups > 1 the samples are split among that many groups
    (separate srt trees, one run-wide tree), so drafts come from both kinds of tree. The
    adaptive draft length depends on the seed only, so these tests draw the same every run;
    the cost rule's lengths depend on timings too."""
    eng = Engine(model, params, drafter, slots=64, budget=4, max_len=32, seed=seed, draft_length=draft_length)
    seqs = [Sequence(PROMPT, max_new_tokens=NEW, group=f"g{i % groups}") for i in range(N)]
    todo = list(seqs)
    while todo or eng.active():
        while todo and eng.free_slots():
            eng.admit(todo.pop())
        eng.step()
    counts: dict[tuple[int, ...], int] = {}
    for s in seqs:
        counts[tuple(s.output)] = counts.get(tuple(s.output), 0) + 1
    return counts, eng


def fit(counts: dict, probs: dict) -> float:
    """Chi-square p-value, pooling the cells expected to hold fewer than 5 samples."""
    n = sum(counts.values())
    keys = sorted(probs, key=probs.get, reverse=True)
    big = [k for k in keys if probs[k] * n >= 5]
    small = [k for k in keys if probs[k] * n < 5]
    c = [counts.get(k, 0) for k in big] + [sum(counts.get(k, 0) for k in small)]
    p = [probs[k] for k in big] + [sum(probs[k] for k in small)]
    return p_value(torch.tensor(c, dtype=torch.float64), torch.tensor(p, dtype=torch.float64))


class SeedDrafter(SrtDrafter):
    """The naive rule: greedy most-frequent-child drafts, verified as if sampled from C."""

    def propose(self, seq, budget):
        d = seq.drafter_state[0].draft(budget, self.min_prob)  # the prompt tree's, after the sequence
        return Proposal(d.tokens, list(d.probs), [{t: q} for t, q in zip(d.tokens, d.probs)])


class Stops(SrtDrafter):
    """The default sample mode, counting the drafts that ended by drawing their stop; with
    `wrong`, such a draft loses its stop (the token there then comes from p: biased)."""

    def __init__(self, wrong: bool = False, **kw):
        super().__init__(mode="sample", min_prob=0.3, **kw)  # fewer children listed: more stops
        self.wrong, self.stops = wrong, 0

    def propose(self, seq, budget):
        prop = super().propose(seq, budget)
        self.stops += prop.stopped
        if self.wrong and prop.stopped:
            return Proposal(prop.tokens, prop.q, prop.dists[: len(prop.tokens)])
        return prop


@pytest.mark.parametrize("draft,params,groups", [
    ("srt-greedy", SamplingParams(1.0), 1),
    ("srt-sample", SamplingParams(1.0), 1),
    ("srt-counts", SamplingParams(1.0), 1),
    ("srt-sample", SamplingParams(1.0), 16),
    ("ngram", SamplingParams(0.8, top_k=4, top_p=0.9), 1),
    ("srt-greedy", SamplingParams(0.7, top_p=0.85), 16),
])
def test_drafted_sampling_matches_the_model_exactly(model, draft, params, groups):
    if draft == "srt-counts":  # children drawn by their counts, never a stop
        drafter = SrtDrafter(mode="sample", stop=False)
    else:
        drafter = SrtDrafter(mode=draft.split("-")[1]) if draft.startswith("srt") else make_drafter(draft)
    counts, eng = sample(model, drafter, params, groups=groups)
    assert eng.stats.accepted > 0.02 * N  # drafting was really exercised
    assert fit(counts, exact(model, params)) > 1e-3


def test_the_seeds_rule_is_caught_end_to_end(model):
    params = SamplingParams(1.0)
    counts, eng = sample(model, SeedDrafter(), params)
    assert eng.stats.accepted > 0.2 * N
    assert fit(counts, exact(model, params)) < 1e-6


def test_drafts_that_stop_are_exact_and_sampling_p_at_the_stop_is_caught(model):
    params = SamplingParams(1.0)
    ok = Stops()
    counts, eng = sample(model, ok, params)
    assert ok.stops > 0.1 * N and eng.stats.accepted > 0.2 * N
    assert fit(counts, exact(model, params)) > 1e-3
    wrong = Stops(wrong=True)
    counts, _ = sample(model, wrong, params)
    assert wrong.stops > 0.1 * N
    assert fit(counts, exact(model, params)) < 1e-6


@pytest.mark.parametrize("draft", ["srt-sample", "srt-greedy"])
def test_drafts_cut_by_the_cost_rule_keep_sampling_exact(model, draft):
    # the cost rule keeps each row's drafts up to a point chosen from timings and confidences
    # known before each draw (a drawn stop kept only where a token would have been): exact
    params = SamplingParams(1.0)
    counts, eng = sample(model, SrtDrafter(mode=draft.split("-")[1]), params, draft_length="cost")
    assert eng.stats.accepted > 0.02 * N
    assert fit(counts, exact(model, params)) > 1e-3
