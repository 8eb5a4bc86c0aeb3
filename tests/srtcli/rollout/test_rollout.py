"""`srt rollout` end to end on a small random HF model directory: the pool is valid and its
old_logprobs are the policy's own, greedy output is identical for every drafter, a second run
on the same cache accepts more per forward, run-ahead stays out of the pool, bad input is one
line, and a run killed mid-write resumes without losing or duplicating a group."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.pool import read_pool
from tests.srtcli.rollout.engine.support import make_model_dir

torch.set_num_threads(1)
QUESTIONS = ["1+1?", "What is 7*6?", "Tom has 3 pens.", "2*(3+4)", "Ana has 12 cups and gives 5.", "9-4?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("model"), sharp=60.0)


def write_prompts(path: Path, n: int = 4) -> Path:
    lines = [json.dumps({"id": f"q{i}", "prompt": QUESTIONS[i % len(QUESTIONS)] + " " * (i // 6),
                         "answer": "2"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def roll(tmp_path, model_dir, *args, prompts=None, out="pool", cache="cache"):
    prompts = prompts or write_prompts(tmp_path / "prompts.jsonl")
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "--model", str(model_dir),
                                 "--out", str(tmp_path / out), "--cache", str(tmp_path / cache),
                                 "--json", *args])
    return r


def summary(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pool_is_valid_and_old_logprobs_are_the_shaped_policy(tmp_path, model_dir):
    s = summary(roll(tmp_path, model_dir, "-n", "3", "--max-new-tokens", "16", "--temperature", "0.7"))
    from srtcli.rollout.summary import SUMMARY_KEYS

    assert set(SUMMARY_KEYS) <= set(s)
    assert s["accepted_per_forward"] >= 1.0
    steps = read_pool(tmp_path / "pool")
    assert len(steps) == 12 and len({st.trajectory_id for st in steps}) == 12
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    for st in steps:
        with torch.inference_mode():
            logits = model(torch.tensor([st.input_ids])).logits[0].float()
        lp = torch.log_softmax(logits / 0.7, -1)[:-1].gather(-1, torch.tensor(st.input_ids[1:])[:, None])[:, 0]
        m = torch.tensor(st.loss_mask[1:], dtype=torch.bool)
        got = torch.tensor(st.old_logprobs[1:])
        torch.testing.assert_close(got[m], lp[m], atol=2e-4, rtol=1e-4)
        assert (got[~m] == 0).all()


def test_greedy_is_identical_for_every_drafter(tmp_path, model_dir):
    pools = {}
    # every drafter's drafts verified whatever they cost; and srt under the cost rule (the default)
    runs = {d: ("--draft", d, "--draft-length", "fixed") for d in ("none", "ngram", "suffix", "srt")}
    runs["srt-tree"] = ("--draft", "srt", "--draft-mode", "tree", "--budget", "12", "--min-prob", "0")
    runs["srt-alone"] = ("--draft", "srt", "--no-shared-tree", "--draft-length", "fixed")
    runs["srt-cost"] = ("--draft", "srt")
    for name, flags in runs.items():
        s = summary(roll(tmp_path, model_dir, "-n", "2", "--temperature", "0", "--max-new-tokens", "24",
                         *flags, out=f"pool-{name}", cache=f"cache-{name}"))
        steps = read_pool(tmp_path / f"pool-{name}")  # groups are written in the order they finish
        pools[name] = sorted((st.meta["prompt_id"], st.meta["sample"], st.input_ids) for st in steps)
        if name not in ("none", "srt-cost"):  # the cost rule may verify no draft on this machine
            assert s["accepted_draft_tokens"] > 0, name
    assert all(pool == pools["none"] for pool in pools.values())


def test_a_second_run_on_the_same_cache_accepts_more(tmp_path, model_dir):
    args = ("-n", "4", "--max-new-tokens", "32", "--no-run-ahead", "--draft-length", "fixed")
    first = summary(roll(tmp_path, model_dir, *args, "--seed", "1", out="p1"))
    second = summary(roll(tmp_path, model_dir, *args, "--seed", "2", out="p2"))  # fresh samples
    assert first["cache_hit_rate"] == 0.0 and second["cache_hit_rate"] == 1.0
    assert second["accepted_per_forward"] > first["accepted_per_forward"]


def test_run_ahead_feeds_trees_but_never_the_pool(tmp_path, model_dir):
    prompts = write_prompts(tmp_path / "p.jsonl", n=4)
    s = summary(roll(tmp_path, model_dir, "-n", "3", "--max-new-tokens", "24", "--rollout-batch", "2",
                     "--batch-size", "4", "--run-ahead", "--run-ahead-tokens", "8", prompts=prompts))
    assert s["run_ahead_tokens"] > 0
    steps = read_pool(tmp_path / "pool")
    assert len(steps) == 12 and all(sum(st.loss_mask) <= 24 for st in steps)
    off = summary(roll(tmp_path, model_dir, "-n", "3", "--max-new-tokens", "24", "--rollout-batch", "2",
                       "--batch-size", "4", "--no-run-ahead", prompts=prompts, out="p-off", cache="c-off"))
    assert off["run_ahead_tokens"] == 0


def one_line_error(r, *needles):
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    for n in needles:
        assert n in r.output, r.output


def test_bad_input_is_one_line_naming_file_and_line(tmp_path, model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "x"\n')
    one_line_error(roll(tmp_path, model_dir, prompts=bad), "bad.jsonl:2:", "malformed JSON")
    bad.write_text('{"prompt": "ok"}\n{"id": 3}\n')
    one_line_error(roll(tmp_path, model_dir, prompts=bad), "bad.jsonl:2:", "prompt")
    bad.write_text('{"prompt": "same"}\n{"prompt": "other"}\n{"prompt": "same"}\n')
    one_line_error(roll(tmp_path, model_dir, prompts=bad), "bad.jsonl:3:", "duplicate of line 1")
    bad.write_text("\n\n")
    one_line_error(roll(tmp_path, model_dir, prompts=bad), "bad.jsonl", "empty")
    bad.write_text(json.dumps({"prompt": "x" * 400}) + "\n")
    one_line_error(roll(tmp_path, model_dir, prompts=bad), "bad.jsonl:1:", "context")
    one_line_error(roll(tmp_path, tmp_path / "nope"), "nope", "not found")
    good = write_prompts(tmp_path / "good.jsonl", 2)
    summary(roll(tmp_path, model_dir, "-n", "2", "--max-new-tokens", "8", prompts=good, out="keep"))
    before = (tmp_path / "keep" / "rollout.jsonl").read_bytes()
    one_line_error(roll(tmp_path, model_dir, "-n", "2", prompts=good, out="keep"), "already exists")
    assert (tmp_path / "keep" / "rollout.jsonl").read_bytes() == before


@pytest.mark.slow
def test_a_killed_run_resumes_without_losing_or_duplicating_groups(tmp_path, model_dir):
    prompts = write_prompts(tmp_path / "many.jsonl", n=24)
    pool = tmp_path / "pool" / "rollout.jsonl"
    cmd = [sys.executable, "-m", "srtcli", "rollout", "--prompts", str(prompts), "--model", str(model_dir),
           "-n", "4", "--max-new-tokens", "48", "--batch-size", "4", "--out", str(tmp_path / "pool"),
           "--cache", str(tmp_path / "cache"), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and (not pool.exists() or pool.stat().st_size < 2000):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert pool.exists() and pool.stat().st_size >= 2000
    with open(pool, "ab") as f:  # as if the kill had landed mid-line
        f.write(b'{"prompt_uid": "trunc')
    kept = pool.read_bytes()
    kept = kept[: kept.rfind(b"\n") + 1]
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    steps = read_pool(tmp_path / "pool")
    by_group: dict[str, set[str]] = {}
    for st in steps:
        by_group.setdefault(st.prompt_uid, set()).add(st.trajectory_id)
    assert len(by_group) == 24 and all(len(t) == 4 for t in by_group.values())
    assert len(steps) == len({(st.trajectory_id, st.step) for st in steps})
    assert s["groups_skipped"] >= 1
    whole = pool.read_bytes()
    # every complete group written before the kill is still there, byte for byte
    n_done = s["groups_skipped"]
    lines = kept.splitlines(keepends=True)
    assert whole.startswith(b"".join(lines[: 4 * n_done]))


def test_tools_flag_runs_end_to_end(tmp_path, model_dir):
    s = summary(roll(tmp_path, model_dir, "-n", "2", "--max-new-tokens", "8", "--tools", "calculator"))
    assert s["generated_tokens"] > 0


def test_one_step_per_model_turn_with_tool_output_untrained(tmp_path):
    from srtcli.rollout.steps import sample_of
    from srtcli.rollout.engine.sequence import Sequence
    from srtcli.pool import parse_step
    from srtcli.rollout.steps import turn_steps
    from tests.srtcli.rollout.engine.support import make_tokenizer

    s = Sequence([1, 2, 3], max_new_tokens=16, meta={"prompt_id": "p", "sample": 1})
    s.tokens += list(range(10, 19))
    s.logprobs += [-0.5] * 3 + [0.0] * 3 + [-0.25] * 3
    s.turns = [(3, 6), (9, 9), (9, 12)]  # an empty turn is no model turn
    s.finish_reason = "stop"
    steps = turn_steps("uid", "p", sample_of(s, make_tokenizer(tmp_path)), 1.0, k=4, temperature=1.0)
    assert [st.step for st in steps] == [0, 1]
    assert steps[0].input_ids == s.tokens[:6] and steps[0].loss_mask == [0, 0, 0, 1, 1, 1]
    assert steps[1].input_ids == s.tokens and steps[1].loss_mask == [0] * 9 + [1] * 3
    assert steps[1].old_logprobs == [0.0] * 9 + [-0.25] * 3
    assert steps[0].meta["finish_reason"] == "tool" and steps[1].meta["last"] is True
    for st in steps:
        assert parse_step(st.to_json()).to_json() == st.to_json()


def test_config_file_keys_are_long_flags(tmp_path, model_dir):
    cfg = tmp_path / "rollout.yaml"
    cfg.write_text("draft: none\nmax-new-tokens: 6\nn: 2\n")
    s = summary(roll(tmp_path, model_dir, "--config", str(cfg)))
    assert s["draft"] == "none" and s["samples_per_prompt"] == 2 and s["cache_hit_rate"] is None
    assert len(read_pool(tmp_path / "pool")) == 8


@pytest.mark.parametrize("tools", [["--tools", "calculator"], []], ids=["explicit", "bundled-default"])
def test_bundled_model_tool_turns_are_separate_steps_with_untrained_results(tmp_path, tools):
    from srtcli.models import default_model_dir, load_tokenizer
    from srtcli.rollout.tools import evaluate

    prompts = tmp_path / "arith.jsonl"
    lines = (Path(__file__).resolve().parents[3] / "examples/arith/prompts.jsonl").read_text().splitlines()
    prompts.write_text("\n".join(lines[:4]) + "\n")
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "-n", "4", "--max-new-tokens", "96",
                                 *tools, "--out", str(tmp_path / "pool"),
                                 "--cache", str(tmp_path / "cache"), "--json"])
    summary(r)
    tok = load_tokenizer(default_model_dir())
    steps = read_pool(tmp_path / "pool")
    later = [st for st in steps if st.step > 0]
    assert later, "the bundled model made no tool call in 16 samples"
    for st in later:
        prev = next(p for p in steps if p.trajectory_id == st.trajectory_id and p.step == st.step - 1)
        assert st.input_ids[: len(prev.input_ids)] == prev.input_ids  # step k+1 extends step k
        first = st.loss_mask.index(1)
        tool_out = tok.decode(st.input_ids[len(prev.input_ids): first])
        assert tool_out.startswith("<result>") and tool_out.endswith("</result>")
        call = tok.decode(prev.input_ids).rsplit("<calc>", 1)[1].split("</calc>")[0]
        value = evaluate(call)
        assert tool_out == f"<result>{'error' if value is None else value}</result>"


def test_tools_none_turns_the_bundled_models_calculator_off(tmp_path):
    prompts = tmp_path / "arith.jsonl"
    lines = (Path(__file__).resolve().parents[3] / "examples/arith/prompts.jsonl").read_text().splitlines()
    prompts.write_text("\n".join(lines[:4]) + "\n")
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "-n", "4", "--max-new-tokens", "96",
                                 "--tools", "none", "--out", str(tmp_path / "pool"),
                                 "--cache", str(tmp_path / "cache"), "--json"])
    summary(r)
    assert {st.step for st in read_pool(tmp_path / "pool")} == {0}  # no tool turns


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line_before_anything_is_written(tmp_path, model_dir):
    one_line_error(roll(tmp_path, model_dir, "--device", "cuda"), "--device cuda:", "use --device cpu")
    assert not (tmp_path / "pool").exists() and not (tmp_path / "cache").exists()
