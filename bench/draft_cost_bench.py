"""Host cost of the cost rule (srtcli/rollout/engine/draft_cost.py) per row per engine step.

Each step the engine asks the rule whether to draft, takes each row's confidences (for srt's
sampled drafts, the concentration of every position's distribution), cuts the drafts, and after
the forward feeds it the forward's time and the verdicts. Here that sequence runs on synthetic
steps: `--rows` rows each with a sampled-style draft of `--budget` positions (distributions of 1-4
children), verdicts drawn at the rule's own expected acceptance, a forward time from a linear
cost. What it keeps is bounded (256 timed forwards, a 4 x 8 table of verdicts), so its cost grows
with the rows and their drafts, never with the run's length: the steps are timed after 2,000
warm-up steps. Printed: microseconds per row per step (median of `--steps`), by part. Not a test.

    .venv/bin/python bench/draft_cost_bench.py --rows 32,256 --budget 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from srtcli.rollout.drafters.base import Proposal  # noqa: E402
from srtcli.rollout.drafters.srt import concentration  # noqa: E402
from srtcli.rollout.engine.draft_cost import DraftCost  # noqa: E402
from srtcli.rollout.engine.engine import confidences  # noqa: E402


def proposals(rng: np.random.Generator, rows: int, budget: int) -> list[Proposal]:
    """Sampled-style drafts: each position drawn from 1-4 children with p-hats."""
    out = []
    for _ in range(rows):
        dists = []
        for _ in range(budget):
            kids = rng.integers(1, 5)
            q = rng.dirichlet(np.ones(kids)) * rng.uniform(0.6, 1.0)
            dists.append(dict(zip(rng.integers(0, 49152, kids).tolist(), q.tolist())))
        toks = [next(iter(d)) for d in dists]
        out.append(Proposal(toks, [d[t] for d, t in zip(dists, toks)], dists))
    return out


def step(rule: DraftCost, props: list[Proposal], rng: np.random.Generator, times: dict[str, list[float]]) -> None:
    rows = len(props)
    t0 = time.perf_counter()
    rule.worth_drafting(rows, rows, 2000)
    t1 = time.perf_counter()
    for pr in props:  # what the srt drafter does when it drafts
        pr.conf = [concentration(d) for d in pr.dists]
    t2 = time.perf_counter()
    confs = [confidences(pr) for pr in props]
    cuts = rule.cut(rows, rows, 2000, confs)
    kept = [pr.truncate(n) for pr, n in zip(props, cuts)]
    t3 = time.perf_counter()
    tokens = rows + sum(cuts)
    rule.observe_forward(tokens, 2000, 0.02 + 1e-5 * rows + 2e-5 * sum(cuts), drafted=sum(cuts))
    accepted = [int(rng.geometric(0.5)) - 1 for _ in kept]
    rule.observe_verdicts([confidences(pr) for pr in kept], [min(a, len(pr.tokens)) for a, pr in zip(accepted, kept)])
    t4 = time.perf_counter()
    for part, (a, b) in zip(("worth_drafting", "confidences", "cut", "learn"), ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
        times[part].append((b - a) * 1e6 / rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="32,256")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    for rows in map(int, args.rows.split(",")):
        rng = np.random.default_rng(0)
        rule, pool = DraftCost(), [proposals(rng, rows, args.budget) for _ in range(8)]
        warm: dict[str, list[float]] = {p: [] for p in ("worth_drafting", "confidences", "cut", "learn")}
        for i in range(2000):
            step(rule, pool[i % 8], rng, warm)
        times: dict[str, list[float]] = {p: [] for p in warm}
        for i in range(args.steps):
            step(rule, pool[i % 8], rng, times)
        med = {p: statistics.median(v) for p, v in times.items()}
        parts = "  ".join(f"{p} {v:5.2f}" for p, v in med.items())
        print(f"{rows:5d} rows, budget {args.budget}: {sum(med.values()):6.2f} us per row per step  ({parts})")


if __name__ == "__main__":
    main()
