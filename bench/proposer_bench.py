"""The SRT proposer's host cost per vLLM engine step (`TreeDrafts.propose`), beside
ArcticInference's suffix cache driven the way vLLM's `suffix` method drives it, on the same steps.

vLLM calls its proposer synchronously inside every decode step, so its cost per row is paid by
every row of every step. The steps are synthetic but shaped like vLLM's: `--rows` rows (16
prompts x K), each decoding row keeps 1-4 new tokens per step; a new request spends one step
prefilling (nothing sampled); a finished request leaves, at most two new ones join per step in
the lowest free rows and the other holes are filled by moving the last rows in (vLLM's
`condense`). Responses are `--tokens` long, noisy copies of a few reasoning paths per prompt
(bench/cache_scale.py's generator); the first rows start part-way through theirs, so the
figures are for rows of every length up to `--tokens`. The trees start empty (no store) and
fill on the fly, as do ArcticInference's.

Each proposer runs its steps on its own (`--interleave`: alternating step by step, each one
then evicting the other's trees from the caches). Printed: microseconds per row per step (median over the steps, and over the last quarter),
mean draft length, and the ratio to ArcticInference; `--own-tree` adds `srt-own`, the proposer
without the run-wide tree (`Table.shared=False`), to see what that tree's inserts cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cache_scale import noisy_copy, zipf_tokens  # noqa: E402
from srtcli.rollout.vllm.table import Table  # noqa: E402
from srtcli.rollout.vllm.tree_drafts import TreeDrafts  # noqa: E402

EOS = 32_001  # never generated: rows end at their length, as a length-capped vLLM request does
PROMPT_LEN, BUDGET, ADMIT = 256, 8, 2
ARCTIC_DEPTH, ARCTIC_CACHED = 24, 10_000  # vLLM's suffix_decoding_max_tree_depth / _max_cached_requests


class Workload:
    """Requests (prompt index, response) in order: K samples of a prompt, then the next prompt."""

    def __init__(self, seed: int, k: int, tokens: int, prompts: int):
        self.rng = np.random.default_rng(seed)
        self.k, self.tokens = k, tokens
        self.prompts = [self.rng.integers(3, 32_000, PROMPT_LEN).tolist() for _ in range(prompts)]
        self.paths: dict[int, list] = {}
        self.next = 0

    def request(self) -> tuple[int, int, np.ndarray]:
        """(request id, prompt index, response tokens) of the next request."""
        rid, p = self.next, self.next // self.k
        self.next += 1
        if p not in self.paths:
            self.paths = {p: [zipf_tokens(self.rng, int(self.tokens * 1.6) + 64) for _ in range(3)]}
        return rid, p, noisy_copy(self.rng, self.paths[p], self.tokens)


class Batch:
    """vLLM's persistent batch: `token_ids_cpu`, `num_tokens_no_spec`, and what each row holds."""

    def __init__(self, work: Workload, rows: int):
        self.work, self.rows = work, rows
        self.ids = np.zeros((rows, PROMPT_LEN + work.tokens + 8), dtype=np.int32)
        self.num = np.zeros(rows, dtype=np.int32)
        self.reqs: list[list] = []  # [request id, prompt index, response, kept, prefilled]
        for _ in range(rows):  # the first rows start part-way through their responses
            self.add(len(self.reqs), start=int(work.rng.integers(0, work.tokens)))

    def add(self, i: int, start: int = 0) -> None:
        rid, p, resp = self.work.request()
        prompt = self.work.prompts[p]
        self.ids[i, :PROMPT_LEN] = prompt
        self.ids[i, PROMPT_LEN:PROMPT_LEN + start] = resp[:start]
        self.num[i] = PROMPT_LEN + start
        req = [rid, p, resp, start, start > 0]
        if i == len(self.reqs):
            self.reqs.append(req)
        else:
            self.reqs[i] = req

    def step(self) -> list[list[int]]:
        """Every decoding row keeps 1-4 tokens; a new row prefills. The sampled tokens per row."""
        sampled = []
        for i, r in enumerate(self.reqs):
            if not r[4]:
                r[4] = True
                sampled.append([])
                continue
            take = r[2][r[3]: r[3] + int(self.work.rng.integers(1, 5))]
            self.ids[i, self.num[i]: self.num[i] + len(take)] = take
            self.num[i] += len(take)
            r[3] += len(take)
            sampled.append(take.tolist())
        return sampled

    def retire(self) -> list[int]:
        """Finished rows leave; up to ADMIT new requests take the lowest free rows, the last rows
        fill the other holes (vLLM's condense). Returns the finished request ids."""
        done = [i for i, r in enumerate(self.reqs) if r[3] >= len(r[2])]
        gone = [self.reqs[i][0] for i in done]
        holes = sorted(done)
        for _ in range(min(ADMIT, len(holes))):
            self.add(holes.pop(0))
        for i in sorted(holes, reverse=True):  # condense: the last row moves into the hole
            last = len(self.reqs) - 1
            if i != last:
                self.ids[i], self.num[i], self.reqs[i] = self.ids[last], self.num[last], self.reqs[last]
            self.reqs.pop()
        while len(self.reqs) < self.rows:  # the batch refills at its end
            self.add(len(self.reqs))
        return gone


class Arctic:
    """ArcticInference's suffix cache, called per row from Python as vLLM's `suffix` method does,
    with vLLM's defaults (tree depth 24, 10,000 cached responses, min_token_prob 0.1)."""

    def __init__(self, max_model_len: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=ARCTIC_DEPTH, max_cached_requests=ARCTIC_CACHED)
        self.max_model_len = max_model_len

    def propose(self, batch: Batch, sampled: list[list[int]]) -> list[list[int]]:
        out = []
        for i, toks in enumerate(sampled):
            if not toks:
                out.append([])
                continue
            rid, n = batch.reqs[i][0], int(batch.num[i])
            if rid not in self.cache.active_requests:
                self.cache.start_request(rid, batch.ids[i, :PROMPT_LEN])
                toks = batch.ids[i, PROMPT_LEN:n]  # what the row kept before it was first seen
            self.cache.add_active_response(rid, toks)
            pattern = batch.ids[i, max(0, n - ARCTIC_DEPTH):n]
            room = min(BUDGET, self.max_model_len - n - 1)
            out.append(self.cache.speculate(rid, pattern, max_spec_tokens=room, min_token_prob=0.1).token_ids)
        return out

    def finish(self, gone: list[int]) -> None:
        for rid in gone:
            if rid in self.cache.active_requests:
                self.cache.stop_request(rid)


def run(args: argparse.Namespace) -> dict:
    k = args.rows // args.prompts
    prompts = args.prompts + (args.steps * ADMIT) // k + 2
    work, arctic_work = (Workload(args.seed, k, args.tokens, prompts) for _ in range(2))
    table = Table(None, args.tokens, [EOS], adaptive=True, fingerprint="tok1-bench")
    max_model_len = PROMPT_LEN + args.tokens + 8
    kinds = {"srt": (TreeDrafts(table, BUDGET, max_model_len), Batch(work, args.rows))}
    if args.own_tree:  # the same without the run-wide tree: what the prompt trees and tracking cost
        own = Table(None, args.tokens, [EOS], adaptive=True, shared=False, fingerprint="tok1-bench")
        kinds["srt-own"] = (TreeDrafts(own, BUDGET, max_model_len), Batch(Workload(args.seed, k, args.tokens, prompts), args.rows))
    try:
        kinds["arctic"] = (Arctic(max_model_len), Batch(arctic_work, args.rows))
    except ImportError:
        print("arctic_inference is not installed: ArcticInference's figures are skipped")
    res: dict = {name: {"us": [], "drafted": 0, "rows": 0} for name in kinds}
    # by default each proposer runs all its steps on its own; `--interleave` alternates them step
    # by step, so each one's memory traffic evicts the other's trees from the caches (both read
    # higher, as a proposer does in a process with other work between its calls)
    order = [(name, step) for step in range(args.steps) for name in kinds] if args.interleave else \
        [(name, step) for name in kinds for step in range(args.steps)]
    for name, _ in order:
        prop, batch = kinds[name]
        sampled = batch.step()
        t0 = time.perf_counter()
        if name == "arctic":
            drafts = prop.propose(batch, sampled)
        else:
            drafts = prop.propose(sampled, batch.num, batch.ids)
        res[name]["us"].append((time.perf_counter() - t0) * 1e6 / len(sampled))
        res[name]["drafted"] += sum(len(d) for d in drafts)
        res[name]["rows"] += sum(1 for t in sampled if t)
        gone = batch.retire()
        if name == "arctic":
            prop.finish(gone)
    return res


def report(args: argparse.Namespace, res: dict) -> None:
    how = "interleaved" if args.interleave else "each on its own"
    print(f"proposer host cost: {args.rows} rows, {args.tokens}-token responses, {args.steps} steps, budget {BUDGET}, {how}")
    print(f"{'proposer':<10}{'us/row/step p50':>17}{'last quarter':>14}{'draft len':>11}{'/arctic':>9}")
    figs = {n: (float(np.median(r["us"])), float(np.median(r["us"][-len(r["us"]) // 4:]))) for n, r in res.items()}
    for name, r in res.items():
        ratio = f"{figs[name][0] / figs['arctic'][0]:.2f}x" if "arctic" in figs else "-"
        print(f"{name:<10}{figs[name][0]:>17.2f}{figs[name][1]:>14.2f}{r['drafted'] / max(r['rows'], 1):>11.2f}{ratio:>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--own-tree", action="store_true", help="also without the run-wide tree (srt-own)")
    ap.add_argument("--interleave", action="store_true", help="alternate the proposers step by step")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 32 rows, 512 tokens, 40 steps")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.prompts, args.tokens, args.steps = 32, 4, 512, 40
    report(args, run(args))


if __name__ == "__main__":
    main()
