"""What a draft adds to one decode forward of the embedded engine, on a real model.

    .venv/bin/python bench/draft_forward_bench.py --model models/smollm2 [--rows 32] [--rounds 6]

`rows` sequences decode side by side (prompts of 150 random tokens); a scripted drafter gives
the first m rows n draft tokens each (random tokens: rejected, so the context grows by one per
step in every case). The cases run interleaved, one step each per round, so they see the same
contexts; printed are the median seconds of the model call per step and the ratio to a plain
decode step. The packed forward's attention is run split (every row's last query, then only
the rows with more; `srtcli.rollout.engine.kv_cache.split_pays`) and unsplit (every row padded
to the longest row's queries), side by side.

Not a test: prints numbers; the machine may be shared, so take them as indicative.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import srtcli.rollout.engine.kv_cache as kv_cache  # noqa: E402
from srtcli.rollout.drafters.base import Drafter, Proposal  # noqa: E402
from srtcli.rollout.engine.engine import Engine  # noqa: E402
from srtcli.rollout.engine.sampling import SamplingParams  # noqa: E402
from srtcli.rollout.engine.sequence import Sequence  # noqa: E402

CASES = [(1, 1), (2, 1), (4, 4), (8, 2), (8, 4)]  # (rows drafting, tokens each)


class Scripted(Drafter):
    """Drafts `n` random tokens on the rows in the first `m` slots."""

    m = n = 0

    def propose(self, seq, budget):
        n = min(self.n, budget) if seq.slot < self.m else 0
        return Proposal([random.randrange(1000) for _ in range(n)], conf=[0.9] * n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    random.seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa").eval()
    drafter = Scripted()
    engine = Engine(model, SamplingParams(1.0, 1.0, 0), drafter, slots=args.rows, budget=8,
                    max_len=160 + 8 * args.rounds * (2 * len(CASES) + 1), draft_length="fixed")
    for _ in range(args.rows):
        engine.admit(Sequence([random.randrange(1000) for _ in range(150)], max_new_tokens=10_000))
    split_pays = kv_cache.split_pays
    cases = [("plain", 0, 0, split_pays)] + [
        (f"{m} rows x {n} {name}", m, n, rule) for m, n in CASES
        for name, rule in (("split", lambda rows, multi, q: q > 1 and multi > 0), ("unsplit", lambda *_: False))]
    seconds: dict[str, list[float]] = {c[0]: [] for c in cases}
    for _ in range(4):
        engine.step()  # the prefills, then plain steps
    for _ in range(args.rounds):
        for name, m, n, rule in cases:
            kv_cache.split_pays, drafter.m, drafter.n = rule, m, n
            before = engine.stats.model_s
            engine.step()
            seconds[name].append(engine.stats.model_s - before)
    kv_cache.split_pays = split_pays
    plain = statistics.median(seconds["plain"])
    print(f"{args.rows} rows, context {len(engine.slots[0].tokens)} after the run; model seconds per step (median)")
    for name, s in seconds.items():
        t = statistics.median(s)
        print(f"{name:22s} {t * 1e3:7.1f} ms  {t / plain:5.2f}x plain")


if __name__ == "__main__":
    main()
