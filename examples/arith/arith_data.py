"""The arith workload: seeded word problems whose integer answers are checked exactly.

Every problem is one of a few kinds (add, subtract, multiply, share, and two-step mixes), asked
in several phrasings. `solution_text(problem, rng)` writes one training response for it in one
of several styles, the way sampled reasoning differs between samples of one prompt (and
`solution(problem, rng)` returns the same response as structure, for other tool formats):

- tool, step by step: one `<calc>` call per step, each followed by its `<result>` (3 turns for
  two-step problems);
- tool, one shot: a single `<calc>` over the whole expression (2 turns);
- mental: no tool, the arithmetic written out in words, and wrong about half the time;
- and in a small share of tool answers the final `<answer>` is miscopied.

So the model trained on it (train_model.py) is imperfect on purpose: at temperature 1 some
samples of a prompt are right and some wrong, GRPO has a signal, and using the calculator
faithfully is what it can learn. Run as a script it writes prompts.jsonl and eval.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

NAMES = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jo", "Kim", "Leo", "Mia", "Noor", "Omar", "Pia"]
ITEMS = ["apples", "pens", "stickers", "marbles", "cards", "books", "shells", "coins", "eggs", "cookies", "stamps", "beads"]
BOXES = ["boxes", "bags", "packs", "jars", "crates", "trays"]


@dataclass
class Step:
    """One arithmetic step: `left op right`; a string operand names an earlier step's value."""

    left: int | str
    op: str
    right: int | str
    words: str  # what this step means, for the step-by-step phrasings


@dataclass
class Problem:
    prompt: str
    answer: int
    steps: list[Step]
    combined: str  # the whole computation as one calculator expression


@dataclass
class Call:
    """One calculator call inside a solution: the expression and the value the tool returns."""

    expression: str
    value: int


@dataclass
class Solution:
    """One training response as structure: `opener`, then each call with the text leading to it,
    then free `working` (the mental style's arithmetic in words), then `closer` with the answer."""

    opener: str
    calls: list[tuple[str, Call]]
    working: str
    answer: int  # the value in the final <answer>, miscopied or wrong sometimes
    closer: str


def _value(operand: int | str, values: dict[str, int]) -> int:
    return values[operand] if isinstance(operand, str) else operand


def _apply(a: int, op: str, b: int) -> int:
    if op == "/":
        return a // b if b else 0  # only a wrong mental step can divide by zero
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def make_problem(rng: random.Random) -> Problem:
    """One random problem of a random kind, in a random phrasing."""
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(BOXES)
    kind = rng.randrange(8)
    if kind == 0:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        q = rng.choice([f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?",
                        f"There are {a} {item} on a table and {b} more in a drawer. How many {item} are there in all?"])
        return Problem(q, a + b, [Step(a, "+", b, "in total")], f"{a}+{b}")
    if kind == 1:
        a = rng.randint(20, 99)
        b = rng.randint(2, a - 1)
        q = rng.choice([f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
                        f"A shop had {a} {item}. It sold {b}. How many {item} does the shop have now?"])
        return Problem(q, a - b, [Step(a, "-", b, "left")], f"{a}-{b}")
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(3, 40)
        q = rng.choice([f"{name} buys {a} {box} of {item}. Each one holds {b} {item}. How many {item} does {name} buy?",
                        f"There are {a} {box} with {b} {item} in each. How many {item} are there?"])
        return Problem(q, a * b, [Step(a, "*", b, "in all")], f"{a}*{b}")
    if kind == 3:
        b, k = rng.randint(2, 9), rng.randint(2, 15)
        a = b * k
        q = rng.choice([f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
                        f"{a} {item} are packed equally into {b} {box}. How many {item} go in each?"])
        return Problem(q, k, [Step(a, "/", b, "each")], f"{a}/{b}")
    if kind == 4:
        a, b = rng.randint(2, 9), rng.randint(3, 25)
        c = rng.randint(1, a * b - 1)
        q = rng.choice([f"{name} buys {a} {box} with {b} {item} each and gives away {c}. How many {item} are left?",
                        f"A class has {a} {box} of {b} {item}. They use {c} {item}. How many {item} remain?"])
        steps = [Step(a, "*", b, f"the {box} hold"), Step("s1", "-", c, "after using some")]
        return Problem(q, a * b - c, steps, f"{a}*{b}-{c}")
    if kind == 5:
        a, b, c = rng.randint(2, 60), rng.randint(2, 9), rng.randint(3, 20)
        q = rng.choice([f"{name} has {a} {item} and buys {b} {box} of {c}. How many {item} does {name} have in total?",
                        f"A shelf has {a} {item}. {name} adds {b} {box} with {c} {item} each. How many {item} are on the shelf?"])
        steps = [Step(b, "*", c, f"the {box} add"), Step(a, "+", "s1", "in total")]
        return Problem(q, a + b * c, steps, f"{a}+{b}*{c}")
    if kind == 6:
        a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 9)
        q = rng.choice([f"Each of {c} {box} has {a} red and {b} blue {item}. How many {item} are there in all?",
                        f"{name} fills {c} {box}, each with {a} small and {b} big {item}. How many {item} is that?"])
        steps = [Step(a, "+", b, "per one"), Step("s1", "*", c, "in all")]
        return Problem(q, (a + b) * c, steps, f"({a}+{b})*{c}")
    c, k = rng.randint(2, 9), rng.randint(2, 12)
    b = rng.randint(1, 30)
    a = c * k + b
    q = rng.choice([f"{name} had {a} {item}, lost {b}, and split the rest equally into {c} {box}. How many {item} are in each?",
                    f"A farm has {a} {item}. {b} are sold and the rest go equally into {c} {box}. How many {item} per one?"])
    steps = [Step(a, "-", b, "remain"), Step("s1", "/", c, "each")]
    return Problem(q, k, steps, f"({a}-{b})/{c}")


OP_WORDS = {"+": ["plus", "and"], "-": ["minus", "take away"], "*": ["times", "multiplied by"], "/": ["divided by", "over"]}
OPENERS = ["", "", "Let me work it out. ", "Step by step. ", "I will use the calculator. ", "OK. "]
MENTAL_OPENERS = ["", "", "Let me work it out. ", "Step by step. ", "OK. "]
CLOSERS = ["<answer>{v}</answer>", "So the answer is <answer>{v}</answer>", "The answer: <answer>{v}</answer>",
           "That gives <answer>{v}</answer>"]


def _wrong(value: int, rng: random.Random) -> int:
    """A plausible wrong value: off by a little, or digits swapped."""
    text = str(abs(value))
    if len(text) >= 2 and rng.random() < 0.3:
        swapped = text[1] + text[0] + text[2:]
        if swapped != text:
            return int(swapped) * (1 if value >= 0 else -1)
    return value + rng.choice([-1, 1]) * rng.randint(1, 10)


def _tool_steps(p: Problem, rng: random.Random) -> tuple[list[tuple[str, Call]], int]:
    values: dict[str, int] = {}
    calls = []
    for i, s in enumerate(p.steps):
        a, b = _value(s.left, values), _value(s.right, values)
        v = _apply(a, s.op, b)
        values[f"s{i + 1}"] = v
        lead = rng.choice(["First, ", f"{s.words.capitalize()}: ", ""]) if i == 0 else rng.choice(["Then ", f"{s.words.capitalize()}: ", "Next, "])
        calls.append((lead, Call(f"{a}{s.op}{b}", v)))
    return calls, values[f"s{len(p.steps)}"]


def _mental(p: Problem, rng: random.Random) -> tuple[str, int]:
    values: dict[str, int] = {}
    parts = []
    for i, s in enumerate(p.steps):
        a, b = _value(s.left, values), _value(s.right, values)
        v = _apply(a, s.op, b)
        if rng.random() < 0.4:  # mental arithmetic is unreliable, on purpose
            v = _wrong(v, rng)
        values[f"s{i + 1}"] = v
        parts.append(f"{a} {rng.choice(OP_WORDS[s.op])} {b} is {v}")
    head = rng.choice(["In my head: ", "Without the calculator, ", "Quickly: "])
    return head + ", then ".join(parts) + ". ", values[f"s{len(p.steps)}"]


def solution(p: Problem, rng: random.Random) -> Solution:
    """One training response for `p`, in a randomly chosen style (see the module docstring)."""
    style = rng.random()
    calls, working = [], ""
    if style < 0.35:
        calls, value = _tool_steps(p, rng)
    elif style < 0.70:
        calls, value = [(rng.choice(["", "In one go: ", "Compute "]), Call(p.combined, p.answer))], p.answer
    else:
        working, value = _mental(p, rng)
    if style < 0.70 and rng.random() < 0.06:
        value = _wrong(value, rng)  # a miscopied answer after a correct tool call
    opener = rng.choice(OPENERS if style < 0.70 else MENTAL_OPENERS)
    return Solution(opener, calls, working, value, rng.choice(CLOSERS).format(v=value))


def solution_text(p: Problem, rng: random.Random) -> str:
    """`solution(p, rng)` in the bundled model's format: `<calc>` calls, each with its `<result>`."""
    s = solution(p, rng)
    calls = " ".join(f"{lead}<calc>{c.expression}</calc><result>{c.value}</result>." for lead, c in s.calls)
    return s.opener + (calls + " " if calls else "") + s.working + s.closer


def prompt_records(n: int, seed: int, prefix: str, exclude: set[str] = frozenset()) -> list[dict]:
    """n distinct problems as prompt records: {"id", "prompt", "answer"}."""
    rng, seen, out = random.Random(seed), set(exclude), []
    while len(out) < n:
        p = make_problem(rng)
        if p.prompt in seen:
            continue
        seen.add(p.prompt)
        out.append({"id": f"{prefix}-{len(out):04d}", "prompt": p.prompt, "answer": str(p.answer)})
    return out


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the arith workload's prompts.jsonl and eval.jsonl.")
    ap.add_argument("--out-dir", default=str(Path(__file__).parent))
    ap.add_argument("--train", type=int, default=128)
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    out = Path(args.out_dir)
    train = prompt_records(args.train, args.seed, "train")
    held = prompt_records(args.eval, args.seed + 1, "eval", exclude={r["prompt"] for r in train})
    write_jsonl(out / "prompts.jsonl", train)
    write_jsonl(out / "eval.jsonl", held)
    print(f"wrote {len(train)} train and {len(held)} eval prompts to {out}")


if __name__ == "__main__":
    main()
