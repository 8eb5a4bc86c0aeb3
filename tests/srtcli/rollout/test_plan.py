"""The order a rollout batch's samples start in: sample-major, so that when a batch holds more
samples than the engine has rows, every prompt has started before any prompt's second sample,
and a prompt's later samples draft from what its earlier ones generated."""

from __future__ import annotations

from pathlib import Path

from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.embedded import rollout_batches
from srtcli.rollout.plan import Plan, admission_order
from srtcli.rollout.prompts import PromptRecord


def test_admission_is_sample_major():
    assert admission_order([3, 5], 3) == [(3, 0), (5, 0), (3, 1), (5, 1), (3, 2), (5, 2)]
    assert admission_order([7], 2) == [(7, 0), (7, 1)]
    assert admission_order([], 4) == []


def test_embedded_batches_start_one_sample_of_every_prompt_first(tmp_path: Path):
    prompts = [PromptRecord(i + 1, {}, f"p{i}", [10 + i, 20 + i]) for i in range(5)]
    pl = Plan(prompts, [f"u{i}" for i in range(5)], lambda r, t: 0.0, tmp_path / "pool.jsonl", set(),
              todo=[0, 1, 2, 3, 4], per=3)
    c = RolloutConfig(prompts_path="unused", k=2, max_new_tokens=4)
    batches, upcoming = rollout_batches(c, pl)
    order = [[(s.group, s.meta["sample"]) for s in b] for b in batches]
    assert order == [[("u0", 0), ("u1", 0), ("u2", 0), ("u0", 1), ("u1", 1), ("u2", 1)],
                     [("u3", 0), ("u4", 0), ("u3", 1), ("u4", 1)]]
    assert all(s.tokens == prompts[int(s.group[1:])].ids for b in batches for s in b)
    assert [[u.uid for u in up] for up in upcoming] == [["u3", "u4"], ["u0", "u1", "u2", "u3", "u4"]]
