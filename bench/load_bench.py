"""What a load's read costs as a prompt's store grows: the bounded newest-first read against
the whole read it replaced, side by side in one process.

A prompt keeps `--stored` rollouts of `--tokens` tokens each (random token ids, so zstd finds
little to save, as with real vocabularies). A load keeps the newest that fit `--load-tokens`
(`cache_store.seqload.LOAD_TOKENS` by default). "bounded" is `store.read(uid, tokens=...)`,
the walk newest first that stops at the bound; "whole" is `store.read(uid)` (every record
decompressed) followed by the same cut, which is what a load did before. The whole load
(bounded read and the tree's build, the same build either way) is timed once, for scale. The
reads alternate, best of `--repeat` each.

    python bench/load_bench.py                       # 16, 64, 256 stored x 8,192 tokens
    python bench/load_bench.py --stored 16,1024 --tokens 1000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache_store.seqload import LOAD_TOKENS, load_tree  # noqa: E402
from cache_store.seqstore import LmdbSequenceStore  # noqa: E402
from cache_store.uid import prompt_uid  # noqa: E402


def whole_then_cut(store: LmdbSequenceStore, uid: str, tokens: int) -> list:
    """The read a load made before: every record, then the newest that fit."""
    seqs = store.read(uid)
    cut, total = len(seqs), 0
    while cut > 0 and (cut == len(seqs) or total + len(seqs[cut - 1].tokens) <= tokens):
        cut -= 1
        total += len(seqs[cut].tokens)
    return seqs[cut:]


def timed(fn) -> tuple[float, object]:  # noqa: ANN001
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(stored: int, tokens: int, load_tokens: int, repeat: int) -> dict:
    uid = prompt_uid([stored, tokens], "load-bench")
    rng = np.random.default_rng(stored)
    with tempfile.TemporaryDirectory() as d, LmdbSequenceStore.open(Path(d) / "cache") as store:
        for start in range(0, stored, 16):  # commits of one group each
            store.append(uid, [rng.integers(0, 150_000, tokens) for _ in range(min(16, stored - start))])
        bounded = whole = float("inf")
        for _ in range(repeat):  # alternating, so drift hits both alike
            tb, kept = timed(lambda: store.read(uid, tokens=load_tokens))
            tw, cut = timed(lambda: whole_then_cut(store, uid, load_tokens))
            bounded, whole = min(bounded, tb), min(whole, tw)
        assert [s.tokens.tolist() for s in kept] == [s.tokens.tolist() for s in cut]
        load, _ = timed(lambda: load_tree(store, uid, tokens=load_tokens))
    return {"stored": stored, "kept": len(kept), "bounded_ms": bounded * 1e3, "whole_ms": whole * 1e3,
            "load_ms": load * 1e3}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stored", default="16,64,256", help="rollouts stored for the prompt (comma-separated runs)")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per rollout")
    ap.add_argument("--load-tokens", type=int, default=LOAD_TOKENS, help="the load's token bound")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    print(f"{a.tokens}-token rollouts, load bound {a.load_tokens} tokens, best of {a.repeat}")
    print(f"{'stored':>7} {'kept':>5} {'bounded read':>13} {'whole read':>11} {'whole/bounded':>14} {'load (read + build)':>20}")
    for n in map(int, a.stored.split(",")):
        r = measure(n, a.tokens, a.load_tokens, a.repeat)
        print(f"{r['stored']:>7} {r['kept']:>5} {r['bounded_ms']:>10.1f} ms {r['whole_ms']:>8.1f} ms "
              f"{r['whole_ms'] / r['bounded_ms']:>13.1f}x {r['load_ms']:>17.1f} ms")


if __name__ == "__main__":
    main()
