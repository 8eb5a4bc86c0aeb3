"""Plain Hugging Face sampling of the agent model with the calculator in the loop: an eval.

    python examples/agent/agent_eval.py -n 1 --temperature 0       # greedy on examples/arith/eval.jsonl
    python examples/agent/agent_eval.py -n 8                       # 8 samples a prompt at temperature 1

The obviously-correct loop (batched `generate`, one turn at a time, the eos the only stop): a turn
holding `<tool_call>{json}</tool_call>` gets the calculator's result appended as the tool turn
rollout appends (agent_data.tool_turn_text; a call that does not parse gets `error`) and the model
continues, up to `max_turns` turns and `max_new_tokens` model tokens per sample. The reward is
`exact_match` on everything after the prompt. It reports the mean reward, how many prompts have
mixed rewards (GRPO needs them), and how often the tool is used.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

import agent_data
from arith_eval import EvalResult, Sample, score  # examples/arith, on the path through agent_data
from srtcli.models import load_model_and_tokenizer
from srtcli.rollout.agent.calculator import calculator

HERE = Path(__file__).resolve().parent
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tool_result(turn: str) -> str | None:
    """The calculator's answer to the call in a model turn; None when the turn calls nothing."""
    m = _CALL.search(turn)
    if m is None:
        return None
    try:
        call = json.loads(m.group(1))
        assert call["name"] == "calculator" and set(call["arguments"]) == {"expression"}
        return calculator(str(call["arguments"]["expression"]))
    except (ValueError, KeyError, TypeError, AssertionError):
        return "error"


def generate_turn(model, tok, ids: list[list[int]], budgets: list[int], temperature: float) -> list[list[int]]:
    """One model turn for each sequence (left-padded batch): its new tokens, up to and with the eos."""
    width = max(len(x) for x in ids)
    batch = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
    attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    out = model.generate(input_ids=batch, attention_mask=attn, do_sample=temperature > 0,
                         temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                         max_new_tokens=max(budgets), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    turns = []
    for row, budget in zip(out[:, width:].tolist(), budgets):
        cut = next((j + 1 for j, t in enumerate(row) if t == tok.eos_token_id), len(row))
        turns.append(row[: min(cut, budget)])
    return turns


@torch.no_grad()
def sample_with_tools(model, tok, records: list[dict], k: int, max_new_tokens: int = 128, max_turns: int = 4,
                      temperature: float = 1.0, seed: int = 0) -> list[Sample]:
    """K samples per prompt record, the calculator answering each turn's tool call."""
    torch.manual_seed(seed)
    ids = [tok.encode(agent_data.prompt_text(tok, r["prompt"]), add_special_tokens=False) for r in records for _ in range(k)]
    start, spent = [len(x) for x in ids], [0] * len(ids)
    samples = [Sample(r["id"], "", 0) for r in records for _ in range(k)]
    active = list(range(len(ids)))
    for _ in range(max_turns):
        active = [i for i in active if spent[i] < max_new_tokens]
        if not active:
            break
        turns = generate_turn(model, tok, [ids[i] for i in active], [max_new_tokens - spent[i] for i in active], temperature)
        still = []
        for i, new in zip(active, turns):
            ids[i] += new
            spent[i] += len(new)
            samples[i].turns += 1
            result = tool_result(tok.decode(new)) if new and new[-1] == tok.eos_token_id else None
            if result is not None:
                ids[i] += tok.encode(agent_data.tool_turn_text(result), add_special_tokens=False)
                still.append(i)
            samples[i].text = tok.decode(ids[i][start[i]:], skip_special_tokens=True)
        active = still
    return samples


def evaluate(model, tok, records: list[dict], k: int, **kw) -> EvalResult:
    return score(sample_with_tools(model, tok, records, k, **kw), records, k, "exact_match", "<tool_call>")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Sample the agent model with the calculator and score it.")
    ap.add_argument("--prompts", type=Path, default=agent_data.ARITH / "eval.jsonl")
    ap.add_argument("--model", type=Path, default=HERE / "model")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="model tokens per sample, all turns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=0, help="print N sample texts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(args.model)
    records = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    records = records[: args.limit] if args.limit else records
    res = evaluate(model, tok, records, args.n, temperature=args.temperature, seed=args.seed,
                   max_new_tokens=args.max_new_tokens)
    for s in res.samples[: args.show]:
        print(f"[{s.prompt_id} r={s.reward}] {s.text}", file=sys.stderr)
    summary = {k: round(v, 4) for k, v in vars(res).items() if k != "samples"}
    summary["prompts_with_mixed_rewards"] = round(res.groups_with_variance * len(records))
    print(json.dumps(summary) if args.json else "  ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
