"""The rollout benchmark's ceiling (bench/oracle_drafter.py): after a plain greedy run records
every sequence, a replay drafts exactly what each will produce, so every draft is accepted and
the outputs are unchanged; its forward count is what a perfect drafter would need."""

from __future__ import annotations

import torch

from bench.oracle_drafter import OracleDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from tests.srtcli.rollout.engine.support import plain_greedy, tiny_model

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7]]


def run(model, drafter) -> tuple[list[Sequence], Engine]:
    eng = Engine(model, SamplingParams(temperature=0), drafter, slots=3, budget=5, max_len=128, eos_ids={5},
                 draft_length="fixed")
    seqs = [Sequence(p, max_new_tokens=8 + 3 * i, group=str(i)) for _ in range(2) for i, p in enumerate(PROMPTS)]
    todo = list(seqs)
    while todo or eng.active():
        while todo and eng.free_slots():
            eng.admit(todo.pop(0))
        eng.step()
    return seqs, eng


def test_replay_accepts_every_draft_and_changes_no_output():
    model, oracle = tiny_model("llama", sharp=4.0), OracleDrafter()
    plain, plain_eng = run(model, oracle)
    assert plain_eng.stats.drafted == 0  # recording drafts nothing
    oracle.replay = True
    replay, eng = run(model, oracle)
    for p, r in zip(plain, replay):
        assert r.output == p.output == plain_greedy(model, p.prompt_ids, p.max_new_tokens, {5})
    assert eng.stats.drafted > 0 and eng.stats.accepted == eng.stats.drafted
    assert eng.stats.row_forwards < plain_eng.stats.row_forwards
