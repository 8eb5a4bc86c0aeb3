"""The agent model (examples/agent/model: chat-template tool calls) through `srt rollout --tools`:
greedy multi-turn trajectories are token-identical to a plain decoding loop with the same tools,
for every drafter, with tools inline and in the worker pool; the tool schemas are in the prompt;
each model turn is a pool step extending the last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.models import load_model_and_tokenizer
from srtcli.pool import read_pool
from srtcli.rollout.agent.calculator import calculator
from srtcli.rollout.agent.formats import ChatFormat
from srtcli.rollout.agent.toolset import ToolSession
from tests.srtcli.rollout.engine.support import plain_greedy

ROOT = Path(__file__).resolve().parents[4]
MODEL = ROOT / "examples/agent/model"
TOOLS = f"{ROOT / 'examples/agent/tools.py'}:TOOLS"
MAX_NEW = 96
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def agent():
    return load_model_and_tokenizer(MODEL)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "prompts.jsonl"
    lines = (ROOT / "examples/arith/eval.jsonl").read_text().splitlines()[:6]
    path.write_text("\n".join(lines) + "\n")
    return path


def reference(model, tok, prompt_ids):
    """Plain greedy decoding (a full forward per token, no cache), the tools run by hand."""
    fmt, session = ChatFormat(tok), ToolSession({"calculator": calculator}, None)
    ids, generated, eos = list(prompt_ids), 0, {tok.eos_token_id}
    while generated < MAX_NEW:
        out = plain_greedy(model, ids, MAX_NEW - generated, eos)
        ids, generated = ids + out, generated + len(out)
        turn = tok.decode(out, skip_special_tokens=False)
        if out[-1] not in eos or not fmt.ends_call(turn, True) or generated >= MAX_NEW:
            break
        calls = fmt.calls(turn)
        ids += tok.encode(fmt.render([(c, session.call(c)) for c in calls]), add_special_tokens=False)
    return ids


def roll(tmp_path, prompts, name, *args):
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "--model", str(MODEL), "--tools", TOOLS,
                                 "-n", "1", "--temperature", "0", "--max-new-tokens", str(MAX_NEW),
                                 "--out", str(tmp_path / name), "--cache", str(tmp_path / f"c-{name}"),
                                 "--json", *args])
    assert r.exit_code == 0, r.output
    return {st.meta["prompt_id"]: st for st in read_pool(tmp_path / name) if st.meta.get("last")}


@pytest.fixture(scope="module")
def want(agent, prompts):
    from srtcli.rollout.prompts import read_prompts
    from srtcli.rollout.agent.toolset import load_tools

    model, tok = agent
    schemas = load_tools(TOOLS).schemas
    return {p.id: reference(model, tok, p.ids) for p in read_prompts(prompts, tok, 10_000, schemas)}


@pytest.mark.parametrize("draft", [["--draft", "none"], ["--draft", "ngram"], ["--draft", "suffix"],
                                   ["--draft", "srt"], ["--draft", "srt", "--draft-mode", "tree"],
                                   ["--draft", "srt", "--tool-workers", "0"]],
                         ids=["none", "ngram", "suffix", "srt", "srt-tree", "srt-inline"])
def test_greedy_multi_turn_equals_plain_decoding_with_the_tools(tmp_path, prompts, want, draft):
    got = roll(tmp_path, prompts, "pool", *draft)
    assert {pid: st.input_ids for pid, st in got.items()} == want
    assert sum(st.step > 0 for st in got.values()) >= 4  # most trajectories called the tool


def test_steps_extend_each_other_and_the_prompt_shows_the_tools(tmp_path, prompts, agent):
    _, tok = agent
    roll(tmp_path, prompts, "pool")
    steps = read_pool(tmp_path / "pool")
    text = tok.decode(steps[0].input_ids, skip_special_tokens=False)
    assert '"name": "calculator"' in text.split("<|im_start|>user")[0]  # the schema, in the system turn
    by_traj: dict = {}
    for st in steps:
        by_traj.setdefault(st.trajectory_id, []).append(st)
    for traj in by_traj.values():
        for prev, st in zip(traj, traj[1:]):
            assert st.input_ids[: len(prev.input_ids)] == prev.input_ids
            gap = tok.decode(st.input_ids[len(prev.input_ids): st.loss_mask.index(1, len(prev.input_ids))],
                             skip_special_tokens=False)
            assert gap.startswith("\n<|im_start|>tool\n<tool_response>") and gap.endswith("<|im_start|>assistant\n")
            assert prev.meta["finish_reason"] == "tool"
    json.dumps([st.meta for st in steps])
