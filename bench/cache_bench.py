"""Benchmark of the persistent tree cache: the token tree's speed and memory (bench_tree) and
why the earlier tree store compressed a whole tree per frame (bench_store; that store itself is
removed, its figures are the recorded ones). Not a test: it prints figures next to their targets
and ratios against baselines measured side by side in the same run.

    .venv/bin/python bench/cache_bench.py [--quick] [--json]
    .venv/bin/python bench/cache_bench.py --scale [--quick] [--json]   # long-CoT scale, bench/cache_scale.py

The tree workload: 16 rollouts of 2,000 tokens for one prompt, built as noisy copies of one base
answer (substitutions, insertions, skips), the way K samples of one prompt resemble each other;
a 17th rollout from the same process is the decoding sequence whose contexts are drafted from.
The baseline is a plain CPython dict-of-dicts suffix trie (the field notes' naive design: longest
match by retrying every suffix length, best child by scanning the children).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache_store.trie import TokenTree  # noqa: E402

TARGETS = {"draft_p50_us": 20.0, "draft_p99_us": 200.0, "insert_tokens_per_s": 100_000.0}


def make_rollouts(n: int, length: int, vocab: int = 32_000, seed: int = 0) -> list[list[int]]:
    """n noisy copies of one base sequence (Zipf-like tokens)."""
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) for r in range(vocab)]
    base = rng.choices(range(vocab), weights, k=length * 2)
    out = []
    for _ in range(n):
        seq, i = [], 0
        while len(seq) < length:
            r = rng.random()
            if r < 0.04:
                seq.append(rng.choices(range(vocab), weights)[0])  # insertion
            elif r < 0.08:
                seq.append(rng.randrange(vocab))  # substitution
                i += 1
            elif r < 0.10:
                i += rng.randrange(1, 5)  # skip ahead
            else:
                seq.append(base[i])
                i += 1
        out.append(seq)
    return out


class NaiveTrie:
    """The baseline: a depth-bounded suffix trie as nested dicts {token: [count, children]}."""

    def __init__(self, max_depth: int) -> None:
        self.d = max_depth
        self.root: dict = {}

    def insert(self, seq: list[int]) -> None:
        for i in range(len(seq)):
            node = self.root
            for t in seq[i:i + self.d]:
                entry = node.get(t)
                if entry is None:
                    entry = node[t] = [0.0, {}]
                entry[0] += 1.0
                node = entry[1]

    def draft(self, ctx: list[int], budget: int = 16, min_prob: float = 0.1) -> list[int]:
        cap = self.d - min(budget, self.d // 2)
        for k in range(min(cap, len(ctx)), 0, -1):
            node = self.root
            for t in ctx[len(ctx) - k:]:
                entry = node.get(t)
                if entry is None:
                    break
                node = entry[1]
            else:
                if node:
                    break
        else:
            return []
        out, score = [], 1.0
        while node and len(out) < budget:
            total = sum(e[0] for e in node.values())
            tok, entry = max(node.items(), key=lambda kv: kv[1][0])
            score *= entry[0] / total
            if score < min_prob:
                break
            out.append(tok)
            node = entry[1]
        return out


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def time_calls(fn, args_list: list) -> list[float]:
    """Microseconds per call, with the garbage collector off while timing."""
    gc.disable()
    try:
        out = []
        for a in args_list:
            t0 = time.perf_counter_ns()
            fn(*a)
            out.append((time.perf_counter_ns() - t0) / 1000.0)
        return out
    finally:
        gc.enable()


def time_insert(make, rollouts: list[list[int]], chunk: int | None) -> tuple[float, float]:
    """Tokens per second (wall clock, CPU time of this process) to build a tree from the
    rollouts, streamed in chunks or whole. On a shared machine the CPU-time rate is the
    steadier figure; the wall-clock one is what a user sees."""
    tree = make()
    gc.disable()
    t0, c0 = time.perf_counter(), time.process_time()
    for seq in rollouts:
        if chunk is None:
            tree.insert(seq)
        else:
            s = tree.stream()
            for i in range(0, len(seq), chunk):
                s.extend(seq[i:i + chunk])
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    gc.enable()
    n = sum(map(len, rollouts))
    return n / dt, n / max(dc, 1e-9)


def bench_tree(quick: bool = False, seed: int = 0) -> dict:
    """Insertion rate at depth 32, draft latency at budget 16 (default depth 64), memory."""
    n, length = (4, 1000) if quick else (16, 2000)
    data = make_rollouts(n + 1, length, seed=seed)
    rollouts, probe = data[:n], data[n]
    tokens = n * length
    res: dict = {"rollouts": n, "rollout_len": length}

    # insertion, depth 32: whole sequences, and streamed 4 tokens at a time (a verified draft)
    for key, make, data_, chunk in (("insert", lambda: TokenTree(32), rollouts, None),
                                    ("stream", lambda: TokenTree(32), rollouts, 4),
                                    ("naive_insert", lambda: NaiveTrie(32), rollouts, None)):
        res[f"{key}_tokens_per_s"], res[f"{key}_tokens_per_cpu_s"] = time_insert(make, data_, chunk)

    # drafting from every position of the probe rollout, default depth 64, budget 16
    tree = TokenTree(64)
    naive = NaiveTrie(64)
    for seq in rollouts:
        tree.insert(seq)
        naive.insert(seq)
    contexts = [(probe[:i],) for i in range(1, len(probe))]
    lat = time_calls(lambda c: tree.draft(c, 16, 0.1), contexts)
    lat_tree = time_calls(lambda c: tree.draft_tree(c, 16, 0.1), contexts)
    lat_naive = time_calls(lambda c: naive.draft(c, 16, 0.1), contexts[:: 4 if quick else 2])
    res.update(
        draft_p50_us=percentile(lat, 0.5), draft_p99_us=percentile(lat, 0.99),
        draft_tree_p50_us=percentile(lat_tree, 0.5), draft_tree_p99_us=percentile(lat_tree, 0.99),
        naive_draft_p50_us=percentile(lat_naive, 0.5), naive_draft_p99_us=percentile(lat_naive, 0.99),
    )
    # draft quality on the probe: how many leading draft tokens the probe really continues with
    drafts = [tree.draft(c[0], 16, 0.1) for c in contexts]
    hits = [next((j for j, (a, b) in enumerate(zip(d.tokens, probe[i + 1:])) if a != b),
                 min(len(d.tokens), len(probe) - i - 1)) for i, d in enumerate(drafts)]
    res["mean_draft_len"] = statistics.mean(len(d.tokens) for d in drafts)
    res["mean_accepted_prefix"] = statistics.mean(hits)

    # memory per stored token (tokens inserted), at both depths
    t32 = TokenTree(32)
    for seq in rollouts:
        t32.insert(seq)
    for name, t in (("d32", t32), ("d64", tree)):
        res[f"nodes_{name}"] = t.nodes
        res[f"memory_bytes_{name}"] = t.memory_bytes()
        res[f"bytes_per_token_{name}"] = t.memory_bytes() / tokens
        res[f"serialized_bytes_per_token_{name}"] = len(t.to_bytes()) / tokens
    # one decay step that drops what occurred only once (what a store floor does to old trees)
    tree.scale(0.5, floor=0.6)
    res["nodes_d64_decayed"] = tree.nodes
    res["bytes_per_token_d64_decayed"] = tree.memory_bytes() / tokens
    # loading a tree from its bytes (the store's load path), per node
    b = tree.to_bytes() if quick else t32.to_bytes()
    c0 = time.perf_counter()
    TokenTree.from_bytes(b)
    res["from_bytes_ns_per_node"] = (time.perf_counter() - c0) * 1e9 / max(1, (len(b) - 16) // 16)
    return res


def report_tree(r: dict) -> None:
    def line(name, value, unit, target=None, better="low", baseline=None):
        s = f"  {name:<34} {value:>12,.1f} {unit:<9}"
        if target is not None:
            ok = value <= target if better == "low" else value >= target
            s += f" target {'<=' if better == 'low' else '>='} {target:,.0f}  {'OK' if ok else 'MISSED'}"
        if baseline is not None:
            ratio = baseline / value if better == "low" else value / baseline
            s += f"  ({ratio:,.1f}x the naive dict trie)"
        print(s)

    print(f"token tree: {r['rollouts']} rollouts x {r['rollout_len']} tokens")
    line("insert depth 32", r["insert_tokens_per_s"], "tokens/s", TARGETS["insert_tokens_per_s"], "high",
         r["naive_insert_tokens_per_s"])
    line("stream depth 32 (4/chunk)", r["stream_tokens_per_s"], "tokens/s", TARGETS["insert_tokens_per_s"], "high",
         r["naive_insert_tokens_per_s"])
    line("naive insert depth 32", r["naive_insert_tokens_per_s"], "tokens/s")
    line("insert depth 32, CPU time", r["insert_tokens_per_cpu_s"], "tokens/s", TARGETS["insert_tokens_per_s"],
         "high", r["naive_insert_tokens_per_cpu_s"])
    line("stream depth 32, CPU time", r["stream_tokens_per_cpu_s"], "tokens/s", TARGETS["insert_tokens_per_s"],
         "high", r["naive_insert_tokens_per_cpu_s"])
    line("draft p50 (budget 16)", r["draft_p50_us"], "us", TARGETS["draft_p50_us"], "low", r["naive_draft_p50_us"])
    line("draft p99 (budget 16)", r["draft_p99_us"], "us", TARGETS["draft_p99_us"], "low", r["naive_draft_p99_us"])
    line("draft_tree p50 (budget 16)", r["draft_tree_p50_us"], "us")
    line("draft_tree p99 (budget 16)", r["draft_tree_p99_us"], "us")
    line("naive draft p50", r["naive_draft_p50_us"], "us")
    line("mean draft length", r["mean_draft_len"], "tokens")
    line("mean accepted prefix", r["mean_accepted_prefix"], "tokens")
    for d in ("d32", "d64"):
        line(f"memory/token {d} ({r[f'nodes_{d}']:,} nodes)", r[f"bytes_per_token_{d}"], "bytes")
        line(f"to_bytes/token {d}", r[f"serialized_bytes_per_token_{d}"], "bytes")
    line(f"memory/token d64 after scale(0.5, floor=0.6) ({r['nodes_d64_decayed']:,} nodes)",
         r["bytes_per_token_d64_decayed"], "bytes")
    line("from_bytes", r["from_bytes_ns_per_node"], "ns/node")


# -- the LMDB layer (bench_store, owned by the store's engineer) ------------------------------


def bench_store(quick: bool = False, seed: int = 0) -> dict:
    """Why the earlier tree store compressed one whole tree per frame: the compression ratio
    per unit choice on bench_tree's workload (16 x 2,000 tokens, depth 64). Frames of k nodes
    are columnar within the frame, like the table. That store (`CacheStore`) has been removed,
    so its load, commit and disk figures are not measured any more: they are the recorded ones
    in docs/benchmarks.md ("Persistent cache store"); the sequence store is measured by --scale.
    """
    import zstandard

    n, length = (4, 1000) if quick else (16, 2000)
    tree = TokenTree(64)
    for seq in make_rollouts(n, length, seed=seed):
        tree.insert(seq)
    table = tree.to_bytes()
    res: dict = {"rollouts": n, "rollout_len": length, "nodes": tree.nodes, "raw_bytes": len(table)}
    res.update(_compression_by_unit(table, tree.nodes, zstandard))
    report_store(res)
    return res


def _compression_by_unit(table: bytes, nodes: int, zstandard) -> dict:  # noqa: ANN001
    """Ratio raw/stored when each frame holds k nodes (8 bytes of key per frame), or the tree."""
    head = len(table) - 16 * nodes
    cols = [table[head + off * nodes: head + (off + w) * nodes] for off, w in ((0, 4), (4, 4), (8, 8))]
    cctx = zstandard.ZstdCompressor(level=3)
    sample = min(nodes, 65536)  # small frames: measured on the first 64 Ki nodes
    out: dict = {}
    for k in (1, 64, 4096):
        raw = comp = 0
        t0 = time.perf_counter()
        for a in range(0, sample, k):
            b = min(a + k, sample)
            c = cols[0][4 * a:4 * b] + cols[1][4 * a:4 * b] + cols[2][8 * a:8 * b]
            raw, comp = raw + len(c), comp + len(cctx.compress(c)) + 8
        out[f"ratio_{k}_nodes_per_frame"] = raw / comp
        out[f"ns_per_node_{k}_nodes_per_frame"] = (time.perf_counter() - t0) / sample * 1e9
    for level in (1, 3, 9):
        t0 = time.perf_counter()
        comp = len(zstandard.ZstdCompressor(level=level).compress(table))
        out[f"ratio_tree_level{level}"] = len(table) / comp
        out[f"ns_per_node_tree_level{level}"] = (time.perf_counter() - t0) / nodes * 1e9
    return out


def report_store(r: dict) -> None:
    print(f"tree record compression: one tree of {r['rollouts']} x {r['rollout_len']} tokens, depth 64: "
          f"{r['nodes']:,} nodes, node table {r['raw_bytes']:,} bytes")
    for k in (1, 64, 4096):
        print(f"  compression, {k:>4} nodes/frame   {r[f'ratio_{k}_nodes_per_frame']:5.2f}x  "
              f"{r[f'ns_per_node_{k}_nodes_per_frame']:7.0f} ns/node")
    for level in (1, 3, 9):
        print(f"  compression, whole tree, zstd {level} {r[f'ratio_tree_level{level}']:5.2f}x  "
              f"{r[f'ns_per_node_tree_level{level}']:7.0f} ns/node" + ("  (the earlier store's)" if level == 3 else ""))
    print("  the earlier tree store (CacheStore) is removed: its load, commit and disk figures are the "
          "recorded ones (docs/benchmarks.md); --scale measures the sequence store")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small workload (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", action="store_true",
                    help="today's trie, the suffix tree and ArcticInference at long-CoT scale (bench/cache_scale.py)")
    ap.add_argument("--max-trie-tokens", type=int, default=200_000,
                    help="with --scale: skip today's trie on workloads above this many tokens")
    ap.add_argument("--kinds", default=None,
                    help="with --scale: which trees, comma-separated (default: trie,new,new-p,arctic)")
    args = ap.parse_args(argv)
    results: dict = {}
    if args.scale:
        from bench.cache_scale import bench_scale

        from bench.cache_kinds import KINDS

        kinds = tuple(args.kinds.split(",")) if args.kinds else KINDS
        if unknown := set(kinds) - set(KINDS):
            ap.error(f"--kinds: unknown {', '.join(sorted(unknown))} (known: {', '.join(KINDS)})")
        results["scale"] = bench_scale(quick=args.quick, max_trie_tokens=args.max_trie_tokens, kinds=kinds)
        if args.json:
            print(json.dumps(results))
        return
    results["tree"] = bench_tree(quick=args.quick, seed=args.seed)
    report_tree(results["tree"])
    results["store"] = bench_store(quick=args.quick, seed=args.seed)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
