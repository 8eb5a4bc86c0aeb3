"""Rows waiting for a tool sit out of the batch: the others keep generating, the waiting row
resumes where it stopped once its result is ready, and outputs are exactly those of running
the tool inline (greedy, every drafter)."""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from srtcli.models import default_model_dir, load_model_and_tokenizer
from srtcli.rollout.agent.calculator import calculator
from srtcli.rollout.agent.formats import TagFormat
from srtcli.rollout.agent.hooks import AgentHooks, TurnLimits
from srtcli.rollout.agent.runner import ToolRunner
from srtcli.rollout.agent.toolset import ToolCall, ToolSession, ToolSet
from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from srtcli.rollout.prompts import render
from tests.srtcli.rollout.engine.support import tiny_model
from tests.srtcli.rollout.engine.test_engine_sampling import fit

torch.set_num_threads(1)
PROMPTS = Path(__file__).resolve().parents[4] / "examples/arith/prompts.jsonl"


@pytest.fixture(scope="module")
def bundled():
    return load_model_and_tokenizer(default_model_dir())


def prompts(tok, n):
    lines = PROMPTS.read_text().splitlines()[:n]
    return [render(tok, json.loads(line)["prompt"]) for line in lines]


def engine_with(model, tok, tool, workers, draft="none"):
    tools = ToolSet("test", [], {"calculator": tool})
    hooks = AgentHooks(tok, TagFormat(), tools, ToolRunner(workers, timeout=30), TurnLimits(), {}, {tok.eos_token_id})
    engine = Engine(model, SamplingParams(0.0), make_drafter(draft), slots=4, budget=4, max_len=256,
                    eos_ids={tok.eos_token_id}, stop_fn=hooks.stop, turn_end=hooks.turn_end)
    return engine, hooks


def run_all(engine, seqs):
    queue = list(seqs)
    while queue or engine.active():
        while queue and engine.free_slots():
            engine.admit(queue.pop(0))  # continuous batching: waiting rows keep their slots
        engine.step()
    return [s.tokens for s in seqs]


def test_a_waiting_row_sits_out_while_the_others_generate(bundled):
    model, tok = bundled
    gate, first = threading.Event(), []

    def gated(expression: str) -> str:
        if not first:
            first.append(expression)
            gate.wait(30)  # only the first call blocks, until the test opens the gate
        return calculator(expression)

    engine, hooks = engine_with(model, tok, gated, workers=2)
    seqs = [Sequence(p, 96, meta={"prompt_id": str(i)}) for i, p in enumerate(prompts(tok, 4))]
    for s in seqs:
        engine.admit(s)
    while not any(s.pending is not None for s in seqs):
        engine.step()
    waiting = next(s for s in seqs if s.pending is not None)
    frozen = list(waiting.tokens)
    others = {id(s): len(s.tokens) for s in seqs if s is not waiting}
    for _ in range(5):
        engine.step()
    assert waiting.tokens == frozen and waiting.pending is not None
    assert any(len(s.tokens) > others[id(s)] for s in seqs if s is not waiting)  # the batch went on
    gate.set()
    while engine.active():
        engine.step()
    assert waiting.finish_reason == "stop" and len(waiting.tokens) > len(frozen)
    assert tok.decode(waiting.tokens[len(frozen):]).startswith(f"<result>{calculator(first[0])}</result>")
    hooks.close()


@pytest.mark.parametrize("draft", ["none", "ngram", "suffix"])
def test_greedy_trajectories_with_tools_in_the_pool_equal_inline_tools(bundled, draft):
    model, tok = bundled
    ps = prompts(tok, 6)

    def slow(expression: str) -> str:
        threading.Event().wait(0.02)
        return calculator(expression)

    inline, h1 = engine_with(model, tok, calculator, workers=0, draft=draft)
    pooled, h2 = engine_with(model, tok, slow, workers=3, draft=draft)
    want = run_all(inline, [Sequence(p, 96) for p in ps])
    got = run_all(pooled, [Sequence(p, 96) for p in ps])
    assert got == want
    assert sum("<result>" in tok.decode(t) for t in want) >= 3  # the prompts really call the tool
    h1.close(), h2.close()


TOOL_TOKEN, RESULT = 4, [1, 2]  # a turn ends at token 4; the "tool" answers with tokens 1 2
V, NEW, N = 5, 3, 3000
PROMPT = [1, 2, 3]


POLICY = (tiny_model("qwen2", vocab=V, sharp=6.0, seed=3), tuple(PROMPT))  # sharp: drafts often right


@functools.cache
@torch.inference_mode()
def multi_turn_exact(model, prompt):
    """P(generated tokens) of every trajectory of NEW generated tokens, the tool's result inserted
    after each token 4 that leaves room for more, by enumeration."""
    import itertools

    out = {}
    for gen in itertools.product(range(V), repeat=NEW):
        ids, p = list(prompt), 1.0
        for i, t in enumerate(gen):
            probs = torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)
            p *= float(probs[t])
            ids.append(t)
            if t == TOOL_TOKEN and i < NEW - 1:
                ids += RESULT
        out[gen] = p
    return out


def sample_with_tools_in_flight(draft: str, seed: int = 0, tool_s: float = 0.003):
    """N trajectories of the tiny model at temperature 1, each token 4 a tool call answered after
    `tool_s` seconds on a worker thread (so rows really wait some steps, and which rows share a
    forward depends on timing, not only on `seed`). Returns the engine and its sequences."""
    model = POLICY[0]
    runner = ToolRunner(workers=8, timeout=10)
    session = ToolSession({"t": lambda: time.sleep(tool_s) or "ok"}, None)

    def stop_fn(seq, emitted):
        return next((i + 1 for i, t in enumerate(emitted) if t == TOOL_TOKEN), None)

    def turn_end(seq):
        return runner.start(session, [ToolCall("t", {})], lambda results: list(RESULT))

    drafter = SrtDrafter(mode="sample") if draft == "srt-sample" else make_drafter(draft)
    eng = Engine(model, SamplingParams(1.0), drafter, slots=64, budget=4, max_len=32, seed=seed,
                 stop_fn=stop_fn, turn_end=turn_end, draft_length="adaptive")  # drafts exercised, whatever they cost
    seqs = [Sequence(PROMPT, max_new_tokens=NEW, group="g") for _ in range(N)]
    run_all(eng, seqs)
    runner.close()
    return eng, seqs


def chi_square_p(seqs) -> float:
    """The chi-square p-value of the sequences' generated tokens against `multi_turn_exact`."""
    counts: dict = {}
    for s in seqs:
        gen = tuple(t for t, m in zip(s.tokens, s.mask) if m)
        counts[gen] = counts.get(gen, 0) + 1
    return fit(counts, multi_turn_exact(*POLICY))


@pytest.mark.parametrize("draft", ["srt-sample", "suffix"])
def test_multi_turn_samples_follow_the_policy_with_tools_in_flight(draft):
    # timing decides the batches, so this run is one of many possible: bench/sampling_calibration.py
    # checks that the p-values of many such runs are uniform (no bias the 1e-3 bar could hide)
    eng, seqs = sample_with_tools_in_flight(draft)
    assert sum(len(s.turns) > 1 for s in seqs) > N // 4  # many trajectories really had tool turns
    assert eng.stats.accepted > 0.02 * N  # and drafting was exercised
    assert chi_square_p(seqs) > 1e-3
