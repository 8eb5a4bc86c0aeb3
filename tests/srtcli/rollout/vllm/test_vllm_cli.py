"""`srt rollout --engine vllm` as a user runs it: a subprocess, `--json` on the last stdout line,
one-line errors with exit 1 and no traceback (skipped where vLLM is not installed, or before
srtcli/cli/rollout.py has the `--engine` option)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
pytestmark = pytest.mark.slow  # vLLM engines take 30-50 s each to start on CPU

from srtcli.cli.rollout import rollout  # noqa: E402

from tests.srtcli.rollout.vllm.test_vllm_engine import model_dir  # noqa: E402,F401  (a module fixture; prompts: conftest)

ROOT = Path(__file__).resolve().parents[4]


def srt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "srtcli", "rollout", "--engine", "vllm", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_vllm_rollout_from_the_command_line(model_dir, prompts, tmp_path):  # noqa: F811
    r = srt("--prompts", str(prompts), "--model", str(model_dir), "-n", "2", "--max-new-tokens", "24",
            "--temperature", "0", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "pool"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1  # vLLM's own log goes to stderr
    summary = json.loads(lines[-1])
    assert summary["engine"] == "vllm" and summary["generated_tokens"] > 0
    steps = [json.loads(x) for x in open(tmp_path / "pool" / "rollout.jsonl")]
    assert all(s["meta"]["last"] and s["meta"]["group_size"] == 2 for s in steps)


def test_sampling_with_srt_drafts_on_cpu_is_one_line_exit_1(model_dir, prompts, tmp_path):  # noqa: F811
    r = srt("--prompts", str(prompts), "--model", str(model_dir), "--temperature", "1",
            "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "pool"))
    assert r.returncode == 1
    assert r.stderr.strip().startswith("Error: --engine vllm on CPU") and "Traceback" not in r.stderr
    assert not (tmp_path / "pool").exists()


def test_the_bundled_models_head_size_is_one_line_exit_1(prompts, tmp_path):  # noqa: F811
    r = srt("--prompts", str(prompts), "--temperature", "0", "--cache", str(tmp_path / "c"))
    assert r.returncode == 1 and "head size 40" in r.stderr and "Traceback" not in r.stderr
