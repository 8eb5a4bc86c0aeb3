"""Benchmark: TRL's GRPOTrainer with srt plugged in against TRL's defaults, side by side.

Runs examples/trl/grpo_arith.py's two trainers in the same process, one after the other, from
the same initial weights and seed, over the same prompts: `srt` (srt's rollout_func drafting from
per-prompt trees and a fresh tree cache, PackedGRPOTrainer's prefix-tree log-prob forwards) and
`trl` (TRL 1.16's defaults: HF `generate`, padded forwards). Per optimizer step it records the
seconds spent generating, the tokens the training log-prob forward runs and the step's seconds;
printed per epoch (mean per step) with the ratio trl / srt, for two workloads:

    bundled  the bundled model on the arith prompts, no tools (TRL cannot parse its <calc> tags)
    agent    examples/agent/model with the calculator: srt's tool loop against TRL's own
    smollm2  the real model, SmolLM2-135M-Instruct (examples/smollm2/prepare.py), on the RL loop's small
             problems (examples/smollm2/rl_prompts.jsonl), the math_answer reward, no tools; run it with
             the real model's settings: --lr 3e-5 --temperature 0.6 --max-completion-length 64 (and small
             --prompts/--per-step/--k: on this CPU a step of 4 prompts x 4 takes about a minute)

Targets (epoch 3, K = 8): generation >= 1.5x faster, forward tokens <= 0.5x, step >= 1.4x faster.
Not a test: timings on a shared machine are noisy (run nothing else meanwhile).

    .venv/bin/python bench/trl_bench.py [--epochs 3] [--prompts 64] [--per-step 16] [--k 8] [--workloads bundled,agent]
        [--lr 3e-4] [--max-completion-length 96] [--temperature 1] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("generate_s", "forward_tokens", "step_s")
TARGETS = {"generate_s": 1.5, "forward_tokens": 2.0, "step_s": 1.4}  # trl / srt at least this


def example_module():
    """examples/trl/grpo_arith.py, loaded by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_arith", ROOT / "examples" / "trl" / "grpo_arith.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(ex, rollout: str, workload: str, a: argparse.Namespace) -> list[dict]:
    """The per-step rows of one training run."""
    with tempfile.TemporaryDirectory(prefix=f"trl-bench-{rollout}-") as d:
        steps = a.epochs * (a.prompts // a.per_step)
        trainer = ex.build_trainer(rollout, workload, Path(d), steps=steps, prompts=a.prompts, per_step=a.per_step,
                                   k=a.k, tools=workload == "agent", seed=a.seed, lr=a.lr,
                                   max_completion_length=a.max_completion_length, temperature=a.temperature)
        log = ex.StepLog(trainer)
        trainer.add_callback(log)
        trainer.train()
        return log.rows


def per_epoch(rows: list[dict]) -> dict[int, dict[str, float]]:
    epochs: dict[int, list[dict]] = {}
    for r in rows:
        epochs.setdefault(r["epoch"], []).append(r)
    return {e: {m: statistics.mean(r[m] for r in rs) for m in METRICS + ("reward",)} for e, rs in epochs.items()}


def report(workload: str, srt: dict, trl: dict) -> list[dict]:
    out = []
    print(f"\n{workload}: mean per optimizer step (trl / srt: higher is better for srt)")
    print(f"{'epoch':>5} {'metric':>15} {'srt':>10} {'trl':>10} {'trl/srt':>8} {'target':>7}")
    for e in sorted(srt):
        for m in METRICS + ("reward",):
            s, t = srt[e][m], trl[e][m]
            ratio = t / s if s else float("nan")
            target = TARGETS.get(m)
            mark = "" if target is None else ("ok" if ratio >= target else "MISS") if e == max(srt) else ""
            print(f"{e:>5} {m:>15} {s:>10.3f} {t:>10.3f} {ratio:>8.2f} {mark:>7}")
            out.append({"workload": workload, "epoch": e, "metric": m, "srt": s, "trl": t, "ratio": ratio})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=64, help="arith prompts per epoch")
    ap.add_argument("--per-step", type=int, default=16, help="prompts per optimizer step")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workloads", default="bundled,agent", help="comma-separated: bundled, agent, smollm2")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-completion-length", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    a = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    sys.path.insert(0, str(ROOT))
    ex = example_module()
    results = []
    for workload in a.workloads.split(","):
        srt = per_epoch(run(ex, "srt", workload, a))
        trl = per_epoch(run(ex, "trl", workload, a))
        results += report(workload, srt, trl)
    if a.json:
        print(json.dumps({"args": vars(a), "results": results}))


if __name__ == "__main__":
    main()
