"""Cost of the engine's tool-call stop check as a turn grows (srtcli.rollout.agent.hooks).

At every emitted token that could close a call (for the bundled `<calc>` format: any token
holding a '>'), the engine asks whether the turn now ends in a call. Decoding the whole turn
for that costs time in proportion to the turn; the check screens the decoded tail first and
decodes the whole turn only when the tail looks like a call's end. Printed: microseconds per
check at each turn length, screened and whole-turn (the check before the screen), and their
ratio. Not a test.

    .venv/bin/python bench/stop_check_bench.py --lengths 100,1000,4000,16000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from srtcli.models import default_model_dir, load_tokenizer  # noqa: E402
from srtcli.rollout.agent.calculator import calculator  # noqa: E402
from srtcli.rollout.agent.formats import TagFormat  # noqa: E402
from srtcli.rollout.agent.hooks import AgentHooks, TurnLimits  # noqa: E402
from srtcli.rollout.agent.runner import ToolRunner  # noqa: E402
from srtcli.rollout.agent.toolset import ToolSet  # noqa: E402
from srtcli.rollout.engine.sequence import Sequence  # noqa: E402


def timed(fn, reps: int) -> float:
    """Fastest of 5 rounds, microseconds per call."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return 1e6 * best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="100,1000,4000,16000", help="turn lengths in tokens")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    tok = load_tokenizer(default_model_dir())
    hooks = AgentHooks(tok, TagFormat(), ToolSet("bench", [], {"calculator": calculator}), ToolRunner(0, 30),
                       TurnLimits(), {}, {tok.eos_token_id})
    filler = tok.encode(" The answer is 3*4 = 12, so (12 > 7) holds and", add_special_tokens=False)
    (gt,) = tok.encode(">", add_special_tokens=False)
    print(f"{'turn tokens':>12s} {'screened us':>12s} {'whole-turn us':>14s} {'ratio':>7s}")
    for n in map(int, args.lengths.split(",")):
        seq = Sequence([1, 2], 1 << 30)
        seq.tokens = [1, 2] + (filler * (n // len(filler) + 1))[:n]
        screened = timed(lambda: hooks.stop(seq, [gt]), args.reps)
        whole = timed(lambda: hooks.fmt.ends_call(hooks._text(seq.tokens[seq.turn_start:] + [gt]), False), args.reps)
        print(f"{n:12d} {screened:12.1f} {whole:14.1f} {whole / screened:6.1f}x")


if __name__ == "__main__":
    main()
