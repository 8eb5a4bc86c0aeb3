"""The agent workload's training data: the arith problems, solved with chat-template tool calls.

The problems and the solution styles are examples/arith/arith_data.py's (`solution` gives one
response as structure); this module renders them in the Hermes format of
`srtcli.tiny_model.TOOL_CHAT_TEMPLATE` instead of the bundled model's `<calc>` tags:

- a model turn that calls the tool is free text, then
  `<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>`, then the eos;
- rollout then appends (not trained) the tool turn and the next assistant header,
  `\\n<|im_start|>tool\\n<tool_response>12</tool_response><|im_end|>\\n<|im_start|>assistant\\n`;
- the last turn ends with `<answer>12</answer>` and the eos.

`encode_example` tokenizes the way rollout does: each segment (the prompt, each model turn, each
tool turn) encoded on its own and concatenated; the model's turns and their eos are trained
(loss mask 1), the prompt and the tool turns never are. `check` verifies this on seeded examples.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from srtcli.rollout.agent.calculator import calculator

ARITH = Path(__file__).resolve().parent.parent / "arith"
sys.path.insert(0, str(ARITH))
import arith_data  # noqa: E402  (examples/ is not a package)

EOS = "<|im_end|>"
TOOLS = [calculator]


def prompt_text(tok, prompt: str) -> str:
    """The prompt as rollout renders it: the system turn listing the tools, the user turn, and
    the assistant header."""
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tools=TOOLS, tokenize=False,
                                   add_generation_prompt=True)


def call_text(expression: str) -> str:
    """A calculator call as the template renders a structured tool call (json.dumps defaults)."""
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def tool_turn_text(result: str) -> str:
    """What rollout appends after a model turn's eos when that turn called a tool."""
    return f"\n<|im_start|>tool\n<tool_response>{result}</tool_response>{EOS}\n<|im_start|>assistant\n"


def model_turns(sol: arith_data.Solution) -> list[tuple[str, arith_data.Call | None]]:
    """The model's turns for one solution: (text, the call that ends it or None for the last)."""
    turns, head = [], sol.opener
    for lead, call in sol.calls:
        turns.append((head + lead + call_text(call.expression), call))
        head = ""
    turns.append((head + sol.working + sol.closer, None))
    return turns


def segments(tok, prompt: str, sol: arith_data.Solution) -> list[tuple[str, bool]]:
    """(text, trained) in rollout order; a trained segment is one model turn (its eos follows)."""
    out = [(prompt_text(tok, prompt), False)]
    for text, call in model_turns(sol):
        out.append((text, True))
        if call is not None:
            out.append((tool_turn_text(calculator(call.expression)), False))
    return out


def encode_example(tok, prompt: str, sol: arith_data.Solution) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask): each segment encoded on its own, an eos after each model turn."""
    ids, mask = [], []
    for text, trained in segments(tok, prompt, sol):
        piece = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if trained else [])
        ids += piece
        mask += [int(trained)] * len(piece)
    return ids, mask


def training_examples(rng: random.Random, avoid: set[str]):
    """Endless (prompt, solution) pairs of fresh problems whose prompts are not in `avoid`."""
    while True:
        p = arith_data.make_problem(rng)
        if p.prompt not in avoid:
            yield p.prompt, arith_data.solution(p, rng)


def workload_prompts() -> list[dict]:
    """The arith workload's prompt records (prompts.jsonl, then eval.jsonl)."""
    return [json.loads(line) for f in ("prompts.jsonl", "eval.jsonl")
            for line in (ARITH / f).read_text().splitlines() if line.strip()]


def conversation(prompt: str, sol: arith_data.Solution) -> list[dict]:
    """The same example as chat messages with structured tool calls (for the template check)."""
    messages = [{"role": "user", "content": prompt}]
    for text, call in model_turns(sol):
        if call is None:
            messages.append({"role": "assistant", "content": text})
            continue
        fn = {"name": "calculator", "arguments": {"expression": call.expression}}
        messages.append({"role": "assistant", "content": text[: text.index("<tool_call>")],
                         "tool_calls": [{"type": "function", "function": fn}]})
        messages.append({"role": "tool", "content": calculator(call.expression)})
    return messages


def check(tok, n: int = 500, seed: int = 0) -> dict:
    """Verify `n` seeded examples; raise AssertionError on the first bad one, else return stats.

    Each must: tokenize segment by segment into what `encode_example` gives, decode back to its
    text, equal the chat template's rendering of the same conversation (structured tool calls
    and tool messages), and get from the calculator the value arith_data computed."""
    rng, whole_differs, longest = random.Random(seed), 0, 0
    for _, (prompt, sol) in zip(range(n), training_examples(rng, set())):
        segs = segments(tok, prompt, sol)
        ids, mask = encode_example(tok, prompt, sol)
        by_segment = [t for text, trained in segs
                      for t in tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if trained else [])]
        assert ids == by_segment, prompt
        text = "".join(t + (EOS if trained else "") for t, trained in segs)
        assert tok.decode(ids) == text, text
        rendered = tok.apply_chat_template(conversation(prompt, sol), tools=TOOLS, tokenize=False)
        assert rendered == text + "\n", (rendered, text)
        assert all(calculator(c.expression) == str(c.value) for _, c in sol.calls), sol
        assert sum(mask) == sum(len(tok.encode(t, add_special_tokens=False)) + 1 for t, tr in segs if tr)
        whole_differs += tok.encode(text, add_special_tokens=False) != ids
        longest = max(longest, len(ids))
    lengths = [len(tok.encode(prompt_text(tok, r["prompt"]), add_special_tokens=False)) for r in workload_prompts()]
    return {"examples": n, "longest_example": longest, "whole_text_encoding_differs": whole_differs,
            "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths)}
