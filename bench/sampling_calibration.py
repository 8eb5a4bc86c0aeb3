"""Calibration of a timing-dependent chi-square test: is a rare failure a false alarm or a bias?

`test_multi_turn_samples_follow_the_policy_with_tools_in_flight` samples 3,000 tool-using
trajectories while tool results arrive on worker threads, so which rows share a forward depends
on timing and the seed alone does not fix its outcome: under an exact sampler its p-value is
uniform and it fails (p <= 1e-3) once in a thousand runs. This runs it many times with fresh
seeds and prints, per drafter, how many p-values fall under 0.01 / 0.05 / 0.1 and the
Kolmogorov-Smirnov distance of all of them to the uniform distribution with its p-value. A bias
too small for one run's 1e-3 bar shows as p-values piled near 0 and a small KS p-value.

    .venv/bin/python bench/sampling_calibration.py --runs 100 --drafters suffix,srt-sample,none
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.srtcli.rollout.engine.test_tool_wait import chi_square_p, sample_with_tools_in_flight  # noqa: E402


def ks_uniform(ps: list[float]) -> tuple[float, float]:
    """The KS distance of `ps` to U(0, 1) and its asymptotic p-value (Kolmogorov's series)."""
    ps, n = sorted(ps), len(ps)
    d = max(max((i + 1) / n - x, x - i / n) for i, x in enumerate(ps))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="runs per drafter (seeds 0..runs-1)")
    ap.add_argument("--drafters", default="suffix,srt-sample,none")
    ap.add_argument("--tool-s", type=float, default=0.003, help="seconds each tool call takes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for draft in args.drafters.split(","):
        ps = [chi_square_p(sample_with_tools_in_flight(draft, seed, args.tool_s)[1]) for seed in range(args.runs)]
        under = " ".join(f"p<{a}: {sum(p < a for p in ps)}" for a in (0.01, 0.05, 0.1))
        d, pk = ks_uniform(ps)
        print(f"{draft:10} runs {len(ps)}  min p {min(ps):.2g}  {under}  KS D {d:.3f} (p {pk:.2f})", flush=True)


if __name__ == "__main__":
    main()
