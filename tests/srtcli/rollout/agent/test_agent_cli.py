"""`srt rollout --tools MODULE:NAME` end to end with the bundled model (its `<calc>` tag format):
the user's tool runs in the worker pool with the same greedy output as the built-in inline one,
an environment's reward reaches the pool, bad tools are one line, and a run killed while a tool
call is in flight resumes to the same pool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.models import default_model_dir, load_tokenizer
from srtcli.pool import read_pool
from tests.srtcli.rollout.agent.tool_files import SLOW_TOOLS_PY

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture()
def tools_py(tmp_path):
    path = tmp_path / "slow_tools.py"
    path.write_text(textwrap.dedent(SLOW_TOOLS_PY))
    return path


def prompts(tmp_path, n=4):
    lines = (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:n]
    path = tmp_path / "arith.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def roll(tmp_path, out, *args):
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "-n", "3", "--max-new-tokens", "96",
                                 "--out", str(tmp_path / out), "--cache", str(tmp_path / f"cache-{out}"),
                                 "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def tokens(pool):
    """The pool's steps, in trajectory order: groups are written as they finish, and with tools in
    the worker pool that order follows the tools' timing."""
    return sorted((st.trajectory_id, st.step, st.input_ids, st.loss_mask) for st in read_pool(pool))


def test_a_user_tool_in_the_worker_pool_gives_the_builtin_inline_output(tmp_path, tools_py):
    roll(tmp_path, "builtin", "--temperature", "0", "--tools", "calculator")
    roll(tmp_path, "user", "--temperature", "0", "--tools", f"{tools_py}:calculator", "--tool-workers", "4")
    assert tokens(tmp_path / "user") == tokens(tmp_path / "builtin")
    assert any(st.step > 0 for st in read_pool(tmp_path / "user"))  # tool turns happened


def test_an_environment_reward_is_the_trajectorys_reward(tmp_path, tools_py):
    roll(tmp_path, "env", "--tools", f"{tools_py}:Arith")
    records = {json.loads(line)["id"]: json.loads(line) for line in prompts(tmp_path).read_text().splitlines()}
    steps = read_pool(tmp_path / "env")
    tok = load_tokenizer(default_model_dir())
    rewards = []
    for st in (st for st in steps if st.meta.get("last")):
        called = "<result>" + str(records[st.meta["prompt_id"]]["answer"]) + "</result>"
        rewards.append(st.reward)
        assert st.reward == (1.0 if called in tok.decode(st.input_ids) else 0.0)
    assert 0.0 < sum(rewards) < len(rewards)  # the environment's reward, not exact_match's


@pytest.mark.parametrize("spec, message", [
    ("calc", "--tools 'calc': expected a built-in (calculator, none, python) or MODULE:NAME"),
    ("{tools}:nothing", "has no attribute 'nothing'"),
])
def test_bad_tools_are_one_line_before_anything_is_written(tmp_path, tools_py, spec, message):
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "--out", str(tmp_path / "p"),
                                 "--tools", spec.format(tools=tools_py)])
    assert r.exit_code == 1 and message in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()


def test_a_tag_format_model_needs_a_tool_named_calculator(tmp_path):
    path = tmp_path / "other.py"
    path.write_text('def lookup(key: str) -> str:\n    """Look up.\n\n    Args:\n        key: the key\n    """\n'
                    '    return key\n')
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "--out", str(tmp_path / "p"),
                                 "--tools", f"{path}:lookup"])
    assert r.exit_code == 1 and "does not show tools to the model" in r.output
    assert not (tmp_path / "p").exists()


def test_a_run_killed_during_a_tool_call_resumes_to_the_uninterrupted_pool(tmp_path, tools_py):
    args = ["--prompts", str(prompts(tmp_path, 6)), "-n", "2", "--temperature", "0", "--max-new-tokens", "96",
            "--rollout-batch", "2", "--tools", f"{tools_py}:calculator", "--json"]
    roll_cmd = [sys.executable, "-m", "srtcli", "rollout", *args]
    whole = tmp_path / "whole"
    subprocess.run([*roll_cmd, "--out", str(whole), "--cache", str(tmp_path / "c1")], check=True,
                   capture_output=True, env={**os.environ, "SRT_TEST_SLEEP": "0"})
    pool, marker = tmp_path / "cut", tmp_path / "in-a-call"
    env = {**os.environ, "SRT_TEST_SLEEP": "0.3", "SRT_TEST_MARKER": str(marker)}
    proc = subprocess.Popen([*roll_cmd, "--out", str(pool), "--cache", str(tmp_path / "c2")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (pool / "rollout.jsonl").is_file() or (pool / "rollout.jsonl").stat().st_size == 0:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    marker.unlink(missing_ok=True)
    while not marker.exists():  # a tool call of the second batch is running now
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = len(read_pool(pool))
    assert 0 < kept < len(read_pool(whole))
    subprocess.run([*roll_cmd, "--out", str(pool), "--cache", str(tmp_path / "c2"), "--resume"], check=True,
                   capture_output=True, env={**os.environ, "SRT_TEST_SLEEP": "0"})
    assert tokens(pool) == tokens(whole)


LONG_PY = '''
def calculator(expression: str) -> str:
    """Answer at length.

    Args:
        expression: the expression
    """
    return "7" * 50
'''


def test_limits_per_trajectory(tmp_path):
    """--max-turns ends a trajectory at its last allowed turn, --max-tool-tokens cuts a result,
    --max-context bounds the whole trajectory."""
    roll(tmp_path, "one", "--max-turns", "1")
    last = [st for st in read_pool(tmp_path / "one")]
    assert all(st.step == 0 for st in last) and "max_turns" in {st.meta["finish_reason"] for st in last}
    long = tmp_path / "long.py"
    long.write_text(LONG_PY)
    roll(tmp_path, "cut", "--tools", f"{long}:calculator", "--max-tool-tokens", "5")
    tok = load_tokenizer(default_model_dir())
    texts = [tok.decode(st.input_ids) for st in read_pool(tmp_path / "cut") if st.step > 0]
    assert texts and all("<result>77777 ...[truncated]</result>" in t for t in texts)
    roll(tmp_path, "short", "--max-context", "60")
    assert max(len(st.input_ids) for st in read_pool(tmp_path / "short")) <= 60


def test_resume_refuses_changed_trajectory_limits(tmp_path):
    roll(tmp_path, "p", "--max-turns", "2")
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "-n", "3", "--max-new-tokens", "96",
                                 "--out", str(tmp_path / "p"), "--resume", "--max-turns", "3"])
    assert r.exit_code == 1 and "--max-turns: recorded 2, now 3" in r.output


def test_a_tool_that_raises_is_a_result_the_model_reads(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text('def calculator(expression: str) -> str:\n    """Fail.\n\n    Args:\n        expression: any\n    """\n'
                    '    raise ValueError("no " + expression)\n')
    roll(tmp_path, "bad", "--tools", f"{path}:calculator", "--tool-timeout", "5")
    tok = load_tokenizer(default_model_dir())
    later = [tok.decode(st.input_ids) for st in read_pool(tmp_path / "bad") if st.step > 0]
    assert later and all("<result>error: ValueError: no " in t for t in later)


def test_a_prompt_longer_than_max_context_is_refused_naming_its_line(tmp_path):
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "--out", str(tmp_path / "p"),
                                 "--max-context", "20"])
    assert r.exit_code == 1 and "arith.jsonl:1:" in r.output and "at most 19" in r.output
    assert not (tmp_path / "p").exists()
