"""bench/draft_coverage.py: a drafted token's chance of acceptance is sum min(p, q), at most the
policy's mass on the children it was drawn from, reached when q is p on them; every chain the
engine verifies is recorded while open, and the engine is restored after."""

import pytest
import torch

from bench.draft_coverage import chain_chances, measure_drafts
from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.drafters.base import Proposal
from srtcli.rollout.engine import engine as engine_module
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from tests.srtcli.rollout.engine.support import tiny_model
from tests.srtcli.rollout.engine.test_engine import PROMPTS, drive

P = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])


def test_a_proposal_equal_to_p_on_its_children_reaches_their_mass():
    exact = Proposal([0], [0.5], [{0: 0.5, 1: 0.3}])  # the stop takes the other 0.2
    acceptance, coverage = chain_chances(P, exact)
    assert acceptance == pytest.approx([0.8]) and coverage == pytest.approx([0.8])


def test_any_other_proposal_over_them_gets_less():
    by_counts = Proposal([0], [0.9], [{0: 0.9, 1: 0.1}])
    acceptance, coverage = chain_chances(P, by_counts)
    assert acceptance == pytest.approx([0.6]) and coverage == pytest.approx([0.8])


def test_a_draft_that_stopped_counts_the_position_of_its_stop():
    stopped = Proposal([0], [0.5], [{0: 0.5, 1: 0.3}, {3: 0.6}])  # drew 0, then the stop (0.4)
    acceptance, coverage = chain_chances(P, stopped)
    assert acceptance == pytest.approx([0.8, 0.6]) and coverage == pytest.approx([0.8, 0.7])
    at_once = Proposal([], [], [{0: 0.5}])  # the stop drawn at the first position
    assert chain_chances(P, at_once) == ([pytest.approx(0.5)], [pytest.approx(0.5)])


def test_a_point_mass_is_accepted_with_p_of_its_token():
    acceptance, coverage = chain_chances(P, Proposal([1, 3]))
    assert acceptance == pytest.approx([0.3, 0.7]) and coverage == pytest.approx([0.3, 0.7])


def test_every_verified_chain_is_recorded_and_the_engine_restored():
    eng = Engine(tiny_model("qwen2", sharp=4.0), SamplingParams(1.0), make_drafter("srt"), slots=4, budget=4,
                 max_len=64, seed=0)
    seqs = [Sequence(p, max_new_tokens=24, group=str(i % 6)) for i, p in enumerate(PROMPTS * 6)]
    verify = engine_module.verify_chains
    with measure_drafts() as seen:
        drive(eng, seqs)
    assert engine_module.verify_chains is verify
    s = seen.summary()
    assert s["chains"] >= 10 and seen.accepted == eng.stats.accepted
    assert 0 < s["first_acceptance"] <= s["first_coverage"] + 1e-6 <= 1 + 1e-6
    assert 0 < s["later_acceptance"] <= s["later_coverage"] + 1e-6
