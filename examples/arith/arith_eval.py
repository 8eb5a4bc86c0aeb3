"""Plain Hugging Face sampling with the calculator in the loop: a reference rollout and an eval.

    python examples/arith/arith_eval.py --prompts examples/arith/eval.jsonl -n 8 [--model DIR] [--json]

This is the simple, obviously-correct way to roll out the bundled workload (batched `generate`,
one turn at a time): it stops a turn at `</calc>` or the eos, appends the calculator's
`<result>...</result>`, and continues, up to `max_turns` turns and `max_new_tokens` generated
tokens per sample. Rewards come from `srtcli.rollout.rewards`. It reports the mean reward, how many
prompts have rewards that differ inside their group (GRPO needs that), and how often the tool is
used. The model tests (tests/srtcli/test_model.py) use it; docs/model.md quotes its numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from srtcli.models import default_model_dir, load_model_and_tokenizer
from srtcli.rollout.rewards import load_reward
from srtcli.rollout.tools import CALC_CLOSE, find_tool_call, run_tool


@dataclass
class Sample:
    prompt_id: str
    text: str  # everything after the prompt: model turns and tool results
    turns: int
    reward: float = 0.0


@dataclass
class EvalResult:
    mean_reward: float
    groups_with_variance: float  # share of prompts whose K rewards are not all equal
    tool_use: float  # share of samples that called the calculator
    mean_turns: float
    samples: list[Sample] = field(default_factory=list)


@torch.no_grad()
def sample_with_tools(model, tok, records: list[dict], k: int, max_new_tokens: int = 96,
                      max_turns: int = 4, temperature: float = 1.0, seed: int = 0) -> list[Sample]:
    """K samples per prompt record with the calculator in the loop (batched, left-padded)."""
    torch.manual_seed(seed)
    eos, stop = tok.eos_token_id, tok.convert_tokens_to_ids(CALC_CLOSE)
    heads = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                     add_generation_prompt=True) for r in records for _ in range(k)]
    ids = [tok.encode(h, add_special_tokens=False) for h in heads]
    start = [len(x) for x in ids]
    samples = [Sample(r["id"], "", 0) for r in records for _ in range(k)]
    active = list(range(len(ids)))
    for _ in range(max_turns):
        budget = [max_new_tokens - (len(ids[i]) - start[i]) for i in active]
        active = [i for i, b in zip(active, budget) if b > 0]
        if not active:
            break
        width = max(len(ids[i]) for i in active)
        batch = torch.tensor([[tok.pad_token_id] * (width - len(ids[i])) + ids[i] for i in active])
        attn = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in active])
        out = model.generate(input_ids=batch, attention_mask=attn, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                             max_new_tokens=max(budget), eos_token_id=[eos, stop], pad_token_id=tok.pad_token_id)
        still = []
        for row, i in enumerate(active):
            new = out[row, width:].tolist()
            cut = next((j + 1 for j, t in enumerate(new) if t in (eos, stop)), len(new))
            new = new[: min(cut, max_new_tokens - (len(ids[i]) - start[i]))]
            ids[i] += new
            samples[i].turns += 1
            samples[i].text = tok.decode(ids[i][start[i]:], skip_special_tokens=True)
            call = find_tool_call(samples[i].text) if new and new[-1] == stop else None
            if call is not None:
                ids[i] += tok.encode(run_tool(call.name, call), add_special_tokens=False)
                samples[i].text = tok.decode(ids[i][start[i]:], skip_special_tokens=True)
                still.append(i)
        active = still
    return samples


def evaluate(model, tok, records: list[dict], k: int, reward: str = "exact_match", **kw) -> EvalResult:
    return score(sample_with_tools(model, tok, records, k, **kw), records, k, reward, "<calc>")


def score(samples: list[Sample], records: list[dict], k: int, reward: str, call: str) -> EvalResult:
    """Rewards and the summary of K samples per record (in record order); `call` marks tool use."""
    fn = load_reward(reward)
    by_id = {r["id"]: r for r in records}
    for s in samples:
        s.reward = fn(by_id[s.prompt_id], s.text)
    groups = [[s.reward for s in samples[i * k:(i + 1) * k]] for i in range(len(records))]
    return EvalResult(
        mean_reward=statistics.fmean(s.reward for s in samples),
        groups_with_variance=sum(len(set(g)) > 1 for g in groups) / len(groups),
        tool_use=sum(call in s.text for s in samples) / len(samples),
        mean_turns=statistics.fmean(s.turns for s in samples),
        samples=samples,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Sample the bundled workload with the calculator and score it.")
    ap.add_argument("--prompts", type=Path, default=Path(__file__).parent / "eval.jsonl")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=0, help="print N sample texts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    model, tok = load_model_and_tokenizer(args.model or default_model_dir())
    records = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    records = records[: args.limit] if args.limit else records
    res = evaluate(model, tok, records, args.n, temperature=args.temperature, seed=args.seed)
    for s in res.samples[: args.show]:
        print(f"[{s.prompt_id} r={s.reward}] {s.text}", file=sys.stderr)
    summary = {k: round(v, 4) for k, v in vars(res).items() if k != "samples"}
    print(json.dumps(summary) if args.json else "  ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
