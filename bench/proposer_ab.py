"""Two versions of the vLLM proposer's row tracking and drafting (`tree_drafts.py`: the working
tree's and the one at a git revision) on the same synthetic steps, alternating step by step in
one process, so the machine's drift hits both alike (on the 2-core dev machine sequential runs
of the same code drift 1.3-2x; alternation is what makes a 3% difference measurable).

Both drive `bench/proposer_bench.py`'s workload (`--verify`: rows keep what their draft got
right and one more) with the whole draft budget. Printed: each version's microseconds per row
per step (mean and median) and whether their drafts were identical at every step.

    python bench/proposer_ab.py --rev HEAD --tokens 1000 --steps 400 --history 8
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import proposer_bench as pb  # noqa: E402
from srtcli.rollout.vllm import tree_drafts  # noqa: E402

MODULE = "srtcli/rollout/vllm/tree_drafts.py"


def module_at(rev: str, where: str):
    """`tree_drafts.py` as it was at `rev`, imported under another name."""
    path = Path(where) / f"tree_drafts_{rev.replace('/', '_')}.py"
    path.write_text(subprocess.run(["git", "show", f"{rev}:{MODULE}"], cwd=ROOT, check=True,
                                   capture_output=True, text=True).stdout)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the git revision to compare the working tree with")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--history", type=int, default=8)
    args = ap.parse_args()
    opts = argparse.Namespace(tokens=args.tokens, fixed_budget=True, history=args.history)
    with tempfile.TemporaryDirectory() as tmp:
        kinds = {}
        for name, mod in ((args.rev, module_at(args.rev, tmp)), ("working tree", tree_drafts)):
            work = pb.Workload(0, 16, args.tokens, 16 + args.steps * pb.ADMIT // 16 + 2, args.history)
            prop, batch = pb.srt_proposer(opts, True, work, tmp, mod.TreeDrafts), pb.Batch(work, 256, verify=True)
            batch.offer(pb.propose(prop, batch, batch.catch_up()))
            kinds[name] = (prop, batch, [], [])
        for step in range(args.steps):
            for name in (list(kinds) if step % 2 else list(kinds)[::-1]):
                prop, batch, us, drafts = kinds[name]
                sampled = batch.step()
                t0 = time.perf_counter()
                out = prop.propose(sampled, batch.num, batch.ids)
                us.append((time.perf_counter() - t0) * 1e6 / len(sampled))
                drafts.append(out)
                batch.offer(out)
                batch.retire()
    (_, _, _, a), (_, _, _, b) = kinds.values()
    print(f"{args.steps} steps, {args.tokens}-token responses, {args.history} earlier responses a prompt; "
          f"drafts identical: {a == b}")
    for name, (_, _, us, _) in kinds.items():
        print(f"{name:<14} mean {np.mean(us):7.2f}  p50 {np.median(us):7.2f} us per row per step")


if __name__ == "__main__":
    main()
