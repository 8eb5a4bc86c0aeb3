"""The engine's adaptive draft length holds only while the batch is full enough for verified
positions to cost compute: once at most FULL_DRAFT_SHARE of the slots run (the long tail), every
row drafts the whole budget (what its sequence still takes permitting). Greedy output stays identical to
plain greedy decoding either way."""

from __future__ import annotations

import torch

import srtcli.rollout.drafters.draft_length as draft_length
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from tests.srtcli.rollout.engine.support import plain_greedy, tiny_model
from tests.srtcli.rollout.engine.test_engine import PROMPTS, drive

torch.set_num_threads(1)
SLOTS, BUDGET = 8, 6


class Asked(SrtDrafter):
    """The srt drafter, recording each chain it is asked for: the rows running in that step, the
    length asked, and what the sequence's adaptive length and remaining tokens allowed."""

    def __init__(self):
        super().__init__()
        self.engine, self.asked = None, []

    def propose(self, seq, budget):
        rows = len(self.engine.active())
        self.asked.append((rows, budget, seq.spec_len, seq.max_new_tokens - seq.generated - 1))
        return super().propose(seq, budget)


def tail_run():
    model = tiny_model("qwen2", sharp=4.0)
    drafter = Asked()
    eng = Engine(model, SamplingParams(0.0), drafter, slots=SLOTS, budget=BUDGET, max_len=128, draft_length="adaptive")
    drafter.engine = eng
    # distinct prompts (no prefix sharing) of ragged lengths, so the batch drains to its tail
    prompts = PROMPTS + [p + [2] for p in PROMPTS]
    seqs = [Sequence(p, max_new_tokens=6 + 4 * i, group=str(i % 6)) for i, p in enumerate(prompts)]
    drive(eng, seqs)
    return model, drafter.asked, seqs


def test_tail_rows_draft_the_whole_budget_full_batches_their_adaptive_length():
    model, asked, seqs = tail_run()
    tail = [a for a in asked if a[0] <= SLOTS * draft_length.FULL_DRAFT_SHARE]
    fuller = [a for a in asked if a[0] > SLOTS * draft_length.FULL_DRAFT_SHARE]
    assert all(budget == min(BUDGET, left) for _, budget, _, left in tail)
    assert all(budget == min(BUDGET, left, spec) for _, budget, spec, left in fuller)
    # both regimes ran, and in the tail the adaptive length really would have been shorter
    assert fuller and any(spec < min(BUDGET, left) for _, _, spec, left in tail)
    for s in seqs:
        assert s.output == plain_greedy(model, s.prompt_ids, s.max_new_tokens)


def test_without_the_tail_rule_tail_rows_keep_their_adaptive_length(monkeypatch):
    # the wrong variant the first test rejects: adaptive lengths in the tail too
    monkeypatch.setattr(draft_length, "FULL_DRAFT_SHARE", 0.0)
    _, asked, _ = tail_run()
    tail = [a for a in asked if a[0] <= SLOTS // 4]
    assert any(budget < min(BUDGET, left) for _, budget, _, left in tail)
