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

The RL loop (examples/rl_loop.sh) needs prompts the model solves a fair part of the time: GRPO
learns only from groups whose rewards differ. On the arith problems it solves about 3% of its
samples at temperature 0.6, so most groups hold one reward and a run barely moves. `--rl` writes
rl_prompts.jsonl (48 training prompts) and rl_eval.jsonl (32 held back, none of the training
problems) from one-step problems with small numbers (add to at most 20 + 9, take away from at
most 20, multiply at most 5 x 5) and an instruction to reply with the number, which the model
answers right about a fifth of the time at temperature 0.6, on about half the prompts at least
once in four samples:

    python examples/smollm2/workload.py --rl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARITH = HERE.parent / "arith"
sys.path.insert(0, str(ARITH))
from arith_data import BOXES, ITEMS, NAMES  # noqa: E402

# no example answer in the instruction: the 135M model copies it ("#### 42") into every response
INSTRUCTION = "\n\nSolve the problem step by step. At the end, write the final answer as a number after ####."


def chat_record(record: dict) -> dict:
    """An arith prompt line as the real-model workload's: the problem in a user message with the
    instruction, the same id and answer."""
    return {"id": record["id"], "prompt": [{"role": "user", "content": record["prompt"] + INSTRUCTION}],
            "answer": record["answer"]}


RL_INSTRUCTION = "\n\nReply with the answer as a number only."
RL_TRAIN, RL_EVAL, RL_SEED = 48, 32, 3


def small_problem(rng: random.Random) -> tuple[str, int]:
    """One one-step word problem with small numbers, in the arith workload's words: the question
    and its answer."""
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(BOXES)
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 20), rng.randint(2, 9)
        return f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?", a + b
    if kind == 1:
        a = rng.randint(5, 20)
        b = rng.randint(1, a - 1)
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", a - b
    a, b = rng.randint(2, 5), rng.randint(2, 5)
    return f"There are {a} {box} with {b} {item} in each. How many {item} are there?", a * b


def rl_records() -> tuple[list[dict], list[dict]]:
    """The RL loop's training and held-back prompts: distinct small problems, seeded."""
    rng, problems = random.Random(RL_SEED), {}
    while len(problems) < RL_TRAIN + RL_EVAL:
        question, answer = small_problem(rng)
        problems.setdefault(question, answer)
    items = list(problems.items())

    def records(split: str, part: list[tuple[str, int]]) -> list[dict]:
        return [{"id": f"{split}-{n:04d}", "prompt": [{"role": "user", "content": q + RL_INSTRUCTION}],
                 "answer": str(a)} for n, (q, a) in enumerate(part)]

    return records("rl-train", items[:RL_TRAIN]), records("rl-eval", items[RL_TRAIN:])


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{path}: {len(records)} prompts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rl", action="store_true", help="write rl_prompts.jsonl and rl_eval.jsonl")
    args = ap.parse_args()
    if args.rl:
        train, held_back = rl_records()
        write_jsonl(HERE / "rl_prompts.jsonl", train)
        write_jsonl(HERE / "rl_eval.jsonl", held_back)
        return
    for name in ("prompts.jsonl", "eval.jsonl"):
        lines = [json.loads(x) for x in (ARITH / name).read_text().splitlines() if x.strip()]
        write_jsonl(HERE / name, [chat_record(r) for r in lines])


if __name__ == "__main__":
    main()
