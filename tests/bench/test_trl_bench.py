"""`trl_bench.py` and the example it runs (examples/trl/grpo_arith.py): both trainers train on
the agent workload with tools, each step is logged with its generation time, forward tokens and
reward, and the packed forwards run fewer tokens than TRL's padded batch of the same groups."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

pytest.importorskip("trl")

from bench.trl_bench import METRICS, example_module, per_epoch, run
from srtcli.rollout.agent.formats import parses_with_prefix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


def trl_reads_tool_calls() -> bool:
    """TRL 1.16's own GRPO trainer reads a tool-calling turn with transformers' `parse_response`
    and the prompt as `prefix` (a tokenizer's response template), which transformers 5.10 lacks."""
    from transformers import PreTrainedTokenizerBase

    return parses_with_prefix(PreTrainedTokenizerBase)


@pytest.mark.skipif(not trl_reads_tool_calls(), reason="TRL's own trainer (the baseline) calls tools only with "
                    "a transformers whose parse_response takes prefix= (5.19 does, 5.10 does not)")
def test_both_trainers_log_every_step_and_packing_runs_fewer_tokens():
    a = Namespace(epochs=2, prompts=4, per_step=2, k=4, seed=0, lr=3e-4, max_completion_length=96, temperature=1.0)
    ex = example_module()
    srt, trl = run(ex, "srt", "agent", a), run(ex, "trl", "agent", a)
    for rows in (srt, trl):
        assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["epoch"] for r in rows] == [1, 1, 2, 2]
        assert all(0.0 <= r["reward"] <= 1.0 and r["generate_s"] > 0 and r["step_s"] >= r["generate_s"]
                   for r in rows)
    # the agent prompt (a 112-token system turn) is encoded once per group, not K = 4 times
    assert all(s["forward_tokens"] < 0.6 * t["forward_tokens"] for s, t in zip(srt, trl))
    summary = per_epoch(srt)
    assert sorted(summary) == [1, 2] and set(METRICS) <= set(summary[1])


def test_the_example_script_runs_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "trl" / "grpo_arith.py"), "--out", str(out), "--steps", "2",
           "--prompts", "4", "--per-step", "2", "--k", "2"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path, timeout=600)
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert (out / "cache").is_dir()  # srt's tree cache, kept for the next run


def test_the_real_model_workload_reads_its_chat_prompts_and_math_answers():
    ex = example_module()
    model_dir, prompts, reward = ex.workload("smollm2")
    assert prompts == ROOT / "examples" / "smollm2" / "rl_prompts.jsonl" and reward == "math_answer"
    ds = ex.arith_dataset(prompts, 2)
    first = json.loads(prompts.read_text().splitlines()[0])
    assert ds[0]["prompt"] == first["prompt"] and ds[0]["answer"] == first["answer"]
    assert ex.arith_dataset(ROOT / "examples" / "arith" / "prompts.jsonl", 1)[0]["prompt"][0]["role"] == "user"
