"""Host cost of the embedded engine's drafters per row step as a sequence grows.

Every engine step each live row costs one `propose` and one `extend` (the tokens it kept). A
drafter whose step grows with what the sequence already holds is paid again at every step of a
long-CoT response. Here one sequence (a 256-token prompt, then `--lengths` generated tokens,
noisy repeats of a few paths as bench/workloads.py makes them, each token with the policy's
probability as the engine feeds it, so srt's draws by p-hat run) is taken to each length, then
timed over `--steps` steps of propose(budget 8) + extend(3 tokens). `ngram-scan` makes the
`ngram` drafter's proposals by a Python backward scan over the whole context at every length
(the drafter itself keeps long sequences in an array; the same proposals). `srt-treeN` asks
srt for its draft tree of N nodes (a tail tree: both streams' trees merged) instead of its
chain. Printed: microseconds per row step. Not a test.

    .venv/bin/python bench/drafter_cost_bench.py --lengths 1000,4000,16000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workloads import noisy_copy, zipf_tokens  # noqa: E402
from srtcli.rollout.drafters import make_drafter  # noqa: E402
from srtcli.rollout.drafters.base import Drafter, Proposal  # noqa: E402
from srtcli.rollout.drafters.ngram import scan_match  # noqa: E402
from srtcli.rollout.engine.sequence import Sequence  # noqa: E402


class ScanNgram(Drafter):
    """Prompt lookup as the Python backward scan over the whole context at every proposal."""

    name = "ngram-scan"

    def propose(self, seq, budget: int) -> Proposal:
        n, i = scan_match(seq.tokens, min(3, len(seq.tokens) - 1))
        return Proposal(seq.tokens[i + 1: i + 1 + budget] if n else [])


class TreeSrt(Drafter):
    """The srt drafter asked for its draft tree of `nodes` nodes (a tail tree) at every step."""

    def __init__(self, nodes: int):
        self.srt, self.nodes = make_drafter("srt"), nodes
        self.name = f"srt-tree{nodes}"

    def begin(self, seq) -> None:
        self.srt.begin(seq)

    def propose(self, seq, budget: int) -> Proposal:
        return self.srt.propose_tree(seq, self.nodes)

    def extend(self, seq, tokens: list[int]) -> None:
        self.srt.extend(seq, tokens)

    def end(self, seq) -> None:
        self.srt.end(seq)


def make(name: str) -> Drafter:
    if name == "ngram-scan":
        return ScanNgram()
    if name.startswith("srt-tree"):
        return TreeSrt(int(name[len("srt-tree"):]))
    return make_drafter(name)


def per_step(drafter: Drafter, tokens: list[int], length: int, steps: int) -> float:
    """Microseconds per propose + extend once the sequence holds `length` generated tokens."""
    seq = Sequence(tokens[:256], 1 << 30, group="g")
    drafter.begin(seq)
    out = tokens[256: 256 + length]
    seq.tokens += out
    seq.logprobs += [-0.1] * length  # the policy's probabilities come with every generated token
    seq.mask += [1] * length
    drafter.extend(seq, out)
    nxt = iter(range(256 + length, len(tokens), 3))
    drafter.propose(seq, 8)  # untimed: a drafter may set up per-sequence state on its first proposal
    t0 = time.perf_counter()
    for _ in range(steps):
        drafter.propose(seq, 8)
        j = next(nxt)
        new = tokens[j: j + 3]
        seq.tokens += new
        seq.logprobs += [-0.1] * 3
        seq.mask += [1] * 3
        drafter.extend(seq, new)
    us = 1e6 * (time.perf_counter() - t0) / steps
    drafter.end(seq)
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1000,4000,16000")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--drafters", default="ngram-scan,ngram,suffix,srt",
                    help="also srt-treeN: srt's draft tree of N nodes (a tail tree) instead of its chain")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rng = np.random.default_rng(0)
    paths = [zipf_tokens(rng, 2 * max(lengths) + 1024) for _ in range(3)]
    response = noisy_copy(rng, paths, max(lengths) + 3 * args.steps + 64)
    tokens = [int(t) for t in rng.integers(3, 32_000, 256)] + [int(t) for t in response]
    print(f"{'drafter':12s}" + "".join(f"{n:>12d}" for n in lengths) + "   (us per row step, by generated tokens)")
    for name in args.drafters.split(","):
        row = []
        for n in lengths:
            d = make(name)
            row.append(per_step(d, tokens, n, args.steps))
        print(f"{name:12s}" + "".join(f"{us:12.1f}" for us in row))


if __name__ == "__main__":
    main()
