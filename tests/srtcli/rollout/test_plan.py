"""The order a rollout batch's samples start in: sample-major by default, so that when a batch
holds more samples than the engine has rows, every prompt has started before any prompt's
second sample, and a prompt's later samples draft from what its earlier ones generated;
prompt-major (`--admission prompt`, flag or config key) starts a prompt's K samples together."""

from __future__ import annotations

from pathlib import Path

from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.embedded import rollout_batches
from srtcli.rollout.plan import Plan, admission_order
from srtcli.rollout.prompts import PromptRecord
from tests.srtcli.rollout.four_ways import rollout_four_ways


def test_admission_is_sample_major_unless_asked_prompt_major():
    assert admission_order([3, 5], 3) == [(3, 0), (5, 0), (3, 1), (5, 1), (3, 2), (5, 2)]
    assert admission_order([3, 5], 3, "prompt") == [(3, 0), (3, 1), (3, 2), (5, 0), (5, 1), (5, 2)]
    assert admission_order([7], 2) == admission_order([7], 2, "prompt") == [(7, 0), (7, 1)]
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


def test_the_flag_or_the_config_key_reaches_the_engine(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from srtcli.cli import cli
    from srtcli.rollout import embedded

    seen, batches = [], embedded.rollout_batches

    def spy(c, pl):
        out = batches(c, pl)
        seen.append([(s.group, s.meta["sample"]) for s in out[0][0]])
        return out

    monkeypatch.setattr(embedded, "rollout_batches", spy)
    rollout_four_ways(tmp_path, ["--admission", "prompt"], "admission: prompt\n", ["--admission", "sample"],
                      prompts=2, extra=("--draft", "none"))
    samples = [[s for _, s in order] for order in seen]
    assert samples == [[0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1]]  # the flag wins over the file
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(tmp_path / "p.jsonl"), "--admission", "random"])
    assert r.exit_code != 0 and "--admission" in r.output
