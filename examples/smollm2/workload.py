"""The real-model workload: the arith word problems as chat prompts that ask for a worked
solution and a final answer math graders can read, scored by srt's built-in `math_answer`.

    python examples/smollm2/workload.py     # rewrites prompts.jsonl and eval.jsonl here

Each line is `{"id", "prompt": [{"role": "user", "content": PROBLEM + INSTRUCTION}], "answer"}`,
made from the same line of examples/arith/prompts.jsonl (128 training prompts) or eval.jsonl
(64 held back), so the two workloads share their problems and ids. A pretrained instruct model
answers in free text: step by step, often wrong, never in the bundled model's `<answer>` tags;
the instruction asks for "#### NUMBER" on the last line, and `math_answer` also reads
`\\boxed{}`, "the answer is" and, failing all, the last number (srtcli/rollout/rewards.py).
SmolLM2-135M-Instruct solves few of them (1 in 12 of the first prompts greedily, "##### 94"
and "The final answer is 16." as often as "#### 88"), so a GRPO run sees rewards of 0 and 1 in a
group now and then.

    srt rollout --prompts examples/smollm2/prompts.jsonl --model models/smollm2 \\
        --reward math_answer --max-new-tokens 256

`--select POOL PROMPTS OUT` keeps the prompts of PROMPTS of which some sample in the screening
rollout POOL earned a reward: the prompts the model sometimes solves, where a GRPO group can
have rewards of 0 and 1. examples/smollm2/rl_loop.sh trains on rl_prompts.jsonl, made as below,
and evaluates on rl_eval.jsonl, made the same way from eval.jsonl (the cost rule's draft
lengths follow timings, so a rerun draws other samples and may keep other prompts):

    srt rollout --prompts examples/smollm2/prompts.jsonl --model models/smollm2 -n 4 \
        --reward math_answer --max-new-tokens 256 --temperature 0.6 --seed 7 --out screen
    python examples/smollm2/workload.py --select screen examples/smollm2/prompts.jsonl \
        examples/smollm2/rl_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARITH = HERE.parent / "arith"
# no example answer in the instruction: the 135M model copies it ("#### 42") into every response
INSTRUCTION = "\n\nSolve the problem step by step. At the end, write the final answer as a number after ####."


def chat_record(record: dict) -> dict:
    """An arith prompt line as the real-model workload's: the problem in a user message with the
    instruction, the same id and answer."""
    return {"id": record["id"], "prompt": [{"role": "user", "content": record["prompt"] + INSTRUCTION}],
            "answer": record["answer"]}


def select(pool: Path, prompts: Path, out: Path) -> int:
    """Write the lines of `prompts` whose id has a rewarded sample in `pool`; returns how many."""
    sys.path.insert(0, str(HERE.parents[1]))
    from srtcli.pool import read_pool

    solved = {s.meta.get("prompt_id") for s in read_pool(pool) if s.reward > 0}
    kept = [ln for ln in prompts.read_text().splitlines() if ln.strip() and json.loads(ln)["id"] in solved]
    out.write_text("".join(ln + "\n" for ln in kept))
    return len(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--select", nargs=3, metavar=("POOL", "PROMPTS", "OUT"))
    args = ap.parse_args()
    if args.select:
        pool, prompts, out = map(Path, args.select)
        print(f"{out}: {select(pool, prompts, out)} prompts")
        return
    for name in ("prompts.jsonl", "eval.jsonl"):
        lines = [json.loads(x) for x in (ARITH / name).read_text().splitlines() if x.strip()]
        (HERE / name).write_text("".join(json.dumps(chat_record(r)) + "\n" for r in lines))
        print(f"{HERE / name}: {len(lines)} prompts")


if __name__ == "__main__":
    main()
