"""Multi-turn tool pools from real rollouts train exactly when packed: `srt rollout --tools` ->
`srt pack` -> one optimizer step equals the per-step reference (loss and gradients), for the
bundled model's tag-format calls and the agent model's chat-template calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.models import default_model_dir
from srtcli.pool import read_pool
from srtcli.train.data import load_packed, load_steps
from srtcli.train.loss import LossConfig
from tests.srtcli.train.fixtures import grads, pack_pool, rel_diff

ROOT = Path(__file__).resolve().parents[4]
AGENT_MODEL = ROOT / "examples/agent/model"
MODELS = {"bundled": (default_model_dir(), "calculator"),
          "agent": (AGENT_MODEL, f"{ROOT / 'examples/agent/tools.py'}:TOOLS")}


def rollout(tmp_path: Path, which: str, n_prompts: int = 4, k: int = 4, *args: str) -> Path:
    model, tools = MODELS[which]
    lines = (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:n_prompts]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "--model", str(model), "--tools", tools,
                                 "-n", str(k), "--max-new-tokens", "96", "--out", str(tmp_path / "pool"),
                                 "--cache", str(tmp_path / "cache"), "--json", *args])
    assert r.exit_code == 0, r.output
    return tmp_path / "pool"


@pytest.mark.parametrize("which", list(MODELS))
def test_packed_training_on_a_tool_pool_equals_the_unpacked_step(tmp_path, which):
    # tools run in the engine's step (--tool-workers 0), so the pool, and with it the float32
    # rounding the bar below allows for, does not depend on when calls finish on a loaded machine
    pool = rollout(tmp_path, which, 4, 4, "--tool-workers", "0")
    steps = read_pool(pool)
    assert sum(st.step > 0 for st in steps) >= 4  # multi-turn trajectories: steps extend steps
    shards = pack_pool(pool, tmp_path / "shards", 4096)
    plain, packed = load_steps(pool).rows, load_packed(shards).rows
    assert sum(r.packed_tokens for r in packed) < sum(r.tokens for r in plain)  # prefixes really shared
    cfg = LossConfig(clip=0.2, agg="token-mean")
    model = MODELS[which][0]
    (lp, gp), (lu, gu) = grads(model, packed, cfg), grads(model, plain, cfg)
    assert abs(lp - lu) <= 1e-5 * max(abs(lu), 1e-3)
    assert rel_diff(gp, gu) <= 1e-5
    json.dumps([st.meta for st in steps])  # meta stays plain JSON
