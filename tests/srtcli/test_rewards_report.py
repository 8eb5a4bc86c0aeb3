"""examples/rl_report.py: per-epoch rewards from real pools, the other commands' JSON, plots and markdown."""

import json
import subprocess
import sys
from pathlib import Path

from srtcli.pool import PoolWriter, StepRecord

REPORT = Path(__file__).resolve().parents[2] / "examples" / "rl_report.py"


def _pool(d: Path, rewards: list[float]):
    """A real pool (written by srtcli.pool) whose trajectories have these rewards; two turns each."""
    d.mkdir(parents=True)
    w = PoolWriter(d / "rollout.jsonl")
    for i, r in enumerate(rewards):
        # the first turn carries a decoy reward: only a trajectory's last step counts
        w.write(StepRecord("u", f"t{i}", 0, [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], 1.0 - r))
        w.write(StepRecord("u", f"t{i}", 1, [1, 2, 3, 4, 5], [0, 0, 0, 0, 1], [0.0] * 4 + [-1.0], r))
    w.close()


def test_report_from_a_run_dir(tmp_path):
    run = tmp_path / "run"
    for e, (tr, ev) in enumerate([([0, 1, 0, 0], [0, 1]), ([1, 1, 0, 1], [1, 1])]):
        d = run / f"epoch-{e}"
        _pool(d / "pool", tr)
        _pool(d / "eval-pool", ev)
        (d / "rollout.json").write_text(json.dumps({"accepted_per_forward": 1.5 + e, "wall_s": 10.0, "tokens_per_s": 100.0}) + "\n")
        if e == 0:
            (d / "pack.json").write_text("progress line\n" + json.dumps({"token_ratio": 0.4}) + "\n")
            (d / "train.json").write_text(json.dumps({"wall_s": 8.0, "steps_run": 4}) + "\n")
    (run / "commands.txt").write_text("srt rollout --prompts p.jsonl\n")
    out = subprocess.run([sys.executable, str(REPORT), str(run)], capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["train_reward"] == [0.25, 0.75] and summary["eval_reward"] == [0.5, 1.0]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics[0]["token_ratio"] == 0.4 and metrics[0]["train_step_s"] == 2.0 and metrics[1]["train_step_s"] is None
    assert metrics[1]["accepted_per_forward"] == 2.5
    md = (run / "report.md").read_text()
    assert "| 0 | 0.250 | 0.500 | 1.50 |" in md and "srt rollout --prompts p.jsonl" in md
    for png in ("reward.png", "accepted.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_epochs_fails(tmp_path):
    out = subprocess.run([sys.executable, str(REPORT), str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1 and "no epoch-* directories" in out.stderr
