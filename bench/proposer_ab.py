"""Two versions of the vLLM proposer on the same synthetic steps, alternating step by step in
one process, so the machine's drift hits both alike (on the 2-core dev machine sequential runs
of the same code drift 1.3-2x; alternation is what makes a 3% difference measurable). The
versions: the working tree's row tracking and drafting (`tree_drafts.py`, `row_tracking.py`)
against the ones at a git revision (`--rev`), or the working tree's compiled suffix tree
against another build of it (`--core`: a copy of `cache_store/_stree*.so` saved before
rebuilding).

Both drive `bench/proposer_bench.py`'s workload (`--verify`: rows keep what their draft got
right and one more) with the whole draft budget. Printed: each version's microseconds per row
per step (mean and median) and whether their drafts were identical at every step.

    python bench/proposer_ab.py --rev HEAD --tokens 1000 --steps 400 --history 8
    cp cache_store/_stree*.so /tmp/old/ && (edit cache_store/csrc, rebuild) && \
        python bench/proposer_ab.py --core /tmp/old/_stree*.so
"""

from __future__ import annotations

import argparse
import importlib.machinery
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

TRACKING, MODULE = "srtcli.rollout.vllm.row_tracking", "srtcli/rollout/vllm/tree_drafts.py"
AT_REV = (TRACKING, "srtcli.rollout.vllm.counters")  # what tree_drafts.py is loaded on at `--rev`


def load_at(rev: str, path: str, where: str):
    """The file `path` as it was at `rev`, imported under another name; None if `rev` has none."""
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode:
        return None
    file = Path(where) / f"{Path(path).stem}_{rev.replace('/', '_')}.py"
    file.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(file.stem, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def module_at(rev: str, where: str):
    """`tree_drafts.py` as it was at `rev`, on the row tracking and counters of `rev` (where they
    are modules of their own there), imported under other names."""
    saved = {name: sys.modules[name] for name in AT_REV}
    try:
        for name in AT_REV:
            sys.modules[name] = load_at(rev, name.replace(".", "/") + ".py", where) or saved[name]
        return load_at(rev, MODULE, where)
    finally:
        sys.modules.update(saved)


# the modules between the compiled core and the proposer, re-imported to bind another core
ON_CORE = ("cache_store.suffix_tree", "cache_store.seqload", "srtcli.rollout.drafters.group_trees",
           "srtcli.rollout.vllm.commits", TRACKING, "srtcli.rollout.vllm.tree_drafts")


def module_on_core(so: str):
    """`tree_drafts` as in the working tree, on the compiled suffix tree built at `so`: its
    chain of modules imported afresh with `cache_store._stree` loaded from there, then the
    originals put back."""
    import cache_store
    saved = {name: sys.modules.pop(name) for name in ("cache_store._stree", *ON_CORE)}
    try:  # (loading an extension puts it in sys.modules itself)
        loader = importlib.machinery.ExtensionFileLoader("cache_store._stree", so)
        core = loader.create_module(importlib.util.spec_from_loader("cache_store._stree", loader))
        sys.modules["cache_store._stree"], cache_store._stree = core, core
        return importlib.import_module("srtcli.rollout.vllm.tree_drafts")
    finally:
        sys.modules.update(saved)
        for name, mod in saved.items():  # an import sets the module on its package too
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, mod)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the git revision to compare the working tree with")
    ap.add_argument("--core", help="instead: another build of the compiled suffix tree (.so) to compare with")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--history", type=int, default=8)
    args = ap.parse_args()
    opts = argparse.Namespace(tokens=args.tokens, fixed_budget=True, history=args.history, load_steps=0)
    with tempfile.TemporaryDirectory() as tmp:
        kinds = {}
        other = (args.core, module_on_core(args.core)) if args.core else (args.rev, module_at(args.rev, tmp))
        for name, mod in (other, ("working tree", tree_drafts)):
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
        print(f"{Path(name).name[:14]:<14} mean {np.mean(us):7.2f}  p50 {np.median(us):7.2f} us per row per step")


if __name__ == "__main__":
    main()
