"""Where a model turn ends in a tool call: the engine's stop check screens each stop candidate
on the decoded tail of the turn and decodes the whole turn only when that tail looks like the
end of a call. It decides exactly as decoding the whole turn at every candidate (turns far
longer than the tail, calls at the end, random byte tokens that split characters at the tail's
start), and a check decodes no more of a long turn than its tail."""

from __future__ import annotations

import random

import pytest

from srtcli.models import default_model_dir, load_tokenizer
from srtcli.rollout.agent import hooks as hooks_module
from srtcli.rollout.agent.calculator import calculator
from srtcli.rollout.agent.formats import TagFormat
from srtcli.rollout.agent.hooks import AgentHooks, TurnLimits
from srtcli.rollout.agent.runner import ToolRunner
from srtcli.rollout.agent.toolset import ToolSet
from srtcli.rollout.engine.sequence import Sequence

PIECES = ["<calc>", "</calc>", "<calc>3*4</calc>", "<result>12</result>", "3*4", "(7+5)", " ", "  ", "\n", ">", "<",
          "/", "calc", "The answer is ", "é", "×", "→", "—", "ok."]


@pytest.fixture(scope="module")
def hooks():
    tok = load_tokenizer(default_model_dir())
    tools = ToolSet("test", [], {"calculator": calculator})
    return AgentHooks(tok, TagFormat(), tools, ToolRunner(0, timeout=30), TurnLimits(), {}, {tok.eos_token_id})


def turns(tok, rng: random.Random, n: int):
    """Turns of pieces of calls, results and text, encoded whole or piece by piece (a model may
    emit a tag in several tokens), some tokens replaced by random ones (single bytes among
    them: characters split between tokens)."""
    for _ in range(n):
        pieces = [rng.choice(PIECES) for _ in range(rng.randint(1, 60))]
        if rng.random() < 0.5:
            ids = tok.encode("".join(pieces), add_special_tokens=False)
        else:  # each piece cut in two at a random character, the halves encoded apart
            cuts = [rng.randint(0, len(p)) for p in pieces]
            halves = [h for p, c in zip(pieces, cuts) for h in (p[:c], p[c:]) if h]
            ids = [t for h in halves for t in tok.encode(h, add_special_tokens=False)]
        yield [rng.randrange(len(tok)) if rng.random() < 0.15 else t for t in ids]


def disagreements(hooks, n: int = 300, seed: int = 0) -> tuple[int, int, int]:
    """(checks where the screened check and the whole-turn decode disagree, checks made, checks
    where the turn ends in a call)."""
    rng, prompt = random.Random(seed), hooks.tok.encode("Q: 2+2?\nA:", add_special_tokens=False)
    bad = checks = calls = 0
    for turn in turns(hooks.tok, rng, n):
        for j, t in enumerate(turn):
            if t not in hooks.candidates:
                continue
            k = rng.randint(1, min(3, j + 1))  # the candidate ends an emission of k tokens
            seq = Sequence(prompt, 10_000)
            seq.tokens = prompt + turn[: j + 1 - k]
            emitted, at_eos = turn[j + 1 - k: j + 1], t in hooks.eos_ids
            whole = hooks.fmt.ends_call(hooks._text(seq.tokens[seq.turn_start:] + emitted), at_eos)
            bad += hooks._ends_call(seq, emitted, at_eos) != whole
            checks, calls = checks + 1, calls + whole
    return bad, checks, calls


def test_the_screened_check_decides_as_the_whole_turn(hooks):
    bad, checks, calls = disagreements(hooks)
    assert bad == 0
    assert checks > 2000 and calls > 100  # calls at the end, and many turns past the tail


def test_a_tail_too_short_to_hold_a_call_is_caught(hooks, monkeypatch):
    # the same check with a one-token tail trusted as it is misses calls whose tag spans tokens
    monkeypatch.setattr(hooks_module, "TAIL_TOKENS", 1)
    monkeypatch.setattr(hooks_module, "TRUST_CHARS", 0)
    assert disagreements(hooks, n=100)[0] > 0


def test_a_check_decodes_the_tail_of_a_long_turn_only(hooks, monkeypatch):
    tok = hooks.tok
    filler = tok.encode(" The answer is 3*4 = 12 and then", add_special_tokens=False)
    (gt,) = tok.encode(">", add_special_tokens=False)
    assert gt in hooks.candidates
    decoded = []
    text = hooks._text
    monkeypatch.setattr(hooks, "_text", lambda ids: decoded.append(len(ids)) or text(ids))
    for n in (64, 16_000):
        seq = Sequence([1, 2], 100_000)
        seq.tokens = [1, 2] + (filler * (n // len(filler) + 1))[:n]
        decoded.clear()
        assert hooks.stop(seq, [gt]) is None
        assert decoded == [hooks_module.TAIL_TOKENS]  # not the turn's n + 1 tokens
    seq.tokens += tok.encode("<calc>3*4</calc", add_special_tokens=False)
    decoded.clear()
    assert hooks.stop(seq, [gt]) == 1  # a call's end: the whole turn is decoded to read it
    assert decoded == [hooks_module.TAIL_TOKENS, len(seq.tokens) - seq.turn_start + 1]
