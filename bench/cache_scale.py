"""The tree cache at long-CoT scale (`bench/cache_bench.py --scale`): today's token trie, the
suffix tree with the sequence store (without and with p-hat, `new` and `new-p`), and
ArcticInference's suffix tree, side by side.

The workload: one prompt's responses are noisy copies (substitutions, insertions, skips) of a
few reasoning paths (a response follows one path and may switch to another part-way), 8,192
tokens each, 16 stored, depth 64. Each kind runs in a child process of its own, so resident
memory is measured per kind. Figures: memory per stored token, insert rate (streamed 4 tokens
at a time, as verified tokens arrive), draft and draft-tree latency at budget 16, load from
LMDB until the first draft, commit of one new response with 16 and with 256 stored, disk bytes
per token, and a replay of an RL run's cache traffic (load at group start, K streamed samples
drafting from the tree, commit at group end). Today's trie is skipped where it would need more
than `--max-trie-tokens` tokens (its memory is about 2.8 KB per token). Its store (`CacheStore`)
has been removed, so its store figures are not measured: the table shows the recorded ones
(`RECORDED_TRIE`, from the full run of 2026-12-01 in docs/benchmarks.md), marked "r".
"""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cache_kinds import KINDS, make_kind  # noqa: E402

TARGETS = {  # figure -> (target, "low" if lower is better)
    "bytes_per_token": (100.0, "low"), "rss_bytes_per_token": (100.0, "low"), "insert_tokens_per_s": (1.5e6, "high"),
    "draft_p50_us": (5.0, "low"), "draft_p99_us": (30.0, "low"), "draft_tree_p50_us": (10.0, "low"),
    "load_first_draft_ms": (50.0, "low"), "commit_ms_16": (5.0, "low"), "commit_ms_256": (10.0, "low"),
    "disk_bytes_per_token": (16.0, "low"), "replay_s_per_step": (0.5, "low"), "replay_peak_rss_gb": (4.0, "low"),
}
RECORDED_TRIE = {"load_first_draft_ms": 625.0, "commit_ms_16": 1532.0, "disk_bytes_per_token": 239.6}
FULL = dict(responses=16, length=8192, paths=3, big=256, steps=20, prompts=16, k=16, epoch=4)
QUICK = dict(responses=4, length=1024, paths=3, big=16, steps=2, prompts=2, k=4, epoch=2)


def zipf_tokens(rng: np.random.Generator, n: int, vocab: int = 32_000) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab + 1)
    return rng.choice(vocab, size=n, p=p / p.sum()).astype(np.int32)


def noisy_copy(rng: np.random.Generator, paths: list[np.ndarray], length: int) -> np.ndarray:
    """One response: a copy of a path with 4% insertions, 4% substitutions, 2% skips of 1-4
    tokens, switching to another path (same position) with probability 0.3 once."""
    first = int(rng.choice(len(paths), p=[0.6, 0.3, 0.1][: len(paths)] / np.sum([0.6, 0.3, 0.1][: len(paths)])))
    switch_at = int(rng.integers(0, length)) if rng.random() < 0.3 else length
    second = int(rng.integers(0, len(paths)))
    n = int(length * 1.25) + 64
    r = rng.random(n)
    advance = np.where(r < 0.04, 0, np.where((r >= 0.08) & (r < 0.10), rng.integers(2, 6, n), 1))
    src = np.cumsum(advance) - advance
    keep = ~((r >= 0.08) & (r < 0.10))
    src, r = src[keep][:length], r[keep][:length]
    out = np.where(np.arange(src.size) < switch_at, paths[first][src], paths[second][src])
    noise = zipf_tokens(rng, src.size)
    return np.where(r < 0.08, noise, out).astype(np.int32)


def token_probs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Synthetic p-hat for n sampled tokens of a long reasoning rollout: most tokens are all but
    determined (80%: Beta(30, 1), mean 0.97), a minority are forks where the policy spreads its
    mass (20%: uniform on (0, 1)). An assumption, not a measurement: p-hat is one byte per token
    in a record whatever its value, and only how well those bytes compress depends on it."""
    fork = rng.random(n) < 0.2
    return np.where(fork, rng.random(n), rng.beta(30.0, 1.0, n)).astype(np.float32)


def make_prompt(seed: int, responses: int, length: int, paths: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    base = [zipf_tokens(rng, int(length * 1.6) + 64) for _ in range(paths)]
    return [noisy_copy(rng, base, length) for _ in range(responses)]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def measure_tree(kind: str, cfg: dict) -> dict:
    """Build one prompt's tree (streamed), then draft from a held-out response's prefixes."""
    data = make_prompt(1, cfg["responses"] + 1, cfg["length"], cfg["paths"])
    stored, probe = data[:-1], data[-1].tolist()
    tokens = sum(a.size for a in stored)
    chunks = [[a[i:i + 4].tolist() for i in range(0, a.size, 4)] for a in stored]
    k = make_kind(kind)  # before the baseline: its fixed set-up is not per stored token
    chunks = [k.prepare(cs) for cs in chunks]
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.process_time()
    for cs in chunks:
        k.stream_all(cs)
    ins = time.process_time() - t0
    out = {"tokens": tokens, "insert_tokens_per_s": tokens / ins, "rss_bytes_per_token": (rss_bytes() - rss0) / tokens,
           "untrimmed_bytes_per_token": k.memory_bytes() / tokens}
    k.trim()  # as a loaded tree is (the suffix tree gives back growth room; the others keep it)
    out["bytes_per_token"] = k.memory_bytes() / tokens
    ctxs = [probe[max(0, i - 64):i] for i in range(1, min(len(probe), 4000))]
    for name, fn in (("draft", k.draft), ("draft_tree", k.draft_tree)):
        lat = []
        gc.disable()
        for c in ctxs:
            t = time.perf_counter_ns()
            fn(c)
            lat.append((time.perf_counter_ns() - t) / 1e3)
        gc.enable()
        out[f"{name}_p50_us"], out[f"{name}_p99_us"] = pct(lat, 0.5), pct(lat, 0.99)
    return out


def measure_store(kind: str, cfg: dict, commits: int = 5) -> dict:
    """Load until the first draft, commit of one response (median of `commits`) with 16 and
    with `big` stored, disk bytes per stored token."""
    out: dict = {}
    small, big = cfg["responses"], cfg["big"]
    data = make_prompt(2, big + commits, cfg["length"], cfg["paths"])
    with tempfile.TemporaryDirectory() as tmp:
        for n, label in ((small, "16"), (big, "256")):
            k = make_kind(kind)
            if not k.persists:
                continue
            store = k.open_store(f"{tmp}/{kind}{n}")
            k.commit_responses(store, "p", data[:n])
            if n == small:
                ctx = data[n][:48].tolist()
                t0 = time.perf_counter()
                k.load(store, "p")
                k.draft(ctx)
                out["load_first_draft_ms"] = (time.perf_counter() - t0) * 1e3
                out["disk_bytes_per_token"] = k.disk_bytes(store, "p") / (n * cfg["length"])
            times = []
            for j in range(commits):
                t0 = time.perf_counter()
                k.commit_responses(store, "p", [data[n + j]])
                times.append((time.perf_counter() - t0) * 1e3)
            out[f"commit_ms_{label}"] = float(np.median(times))
            k.close_store(store)
    return out


def child(kind: str, cfg: dict) -> dict:
    from bench.cache_replay import replay

    res = {"kind": kind, **measure_tree(kind, cfg), **measure_store(kind, cfg)}
    if make_kind(kind).persists:
        res.update(replay(kind, cfg))
    return res


def run_child(kind: str, cfg: dict) -> dict | str:
    p = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(cfg)], capture_output=True, text=True)
    if p.returncode != 0:
        return f"failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _cell(res: dict, kind: str, fig: str) -> str:
    v = res.get(fig)
    if v is None and kind == "trie" and fig in RECORDED_TRIE:
        return f"{RECORDED_TRIE[fig]:>13,.2f}r"
    return f"{v:>14,.2f}" if v is not None else f"{'-':>14}"


def report(results: dict) -> None:
    kinds = [k for k in KINDS if isinstance(results.get(k), dict)]
    print(f"{'figure':<24}" + "".join(f"{k:>14}" for k in kinds) + f"{'new/today':>11}{'new/arctic':>11}  target")
    new = results.get("new", {})
    for fig, (target, better) in TARGETS.items():
        line = f"{fig:<24}" + "".join(_cell(results[k], k, fig) for k in kinds)
        for base in ("trie", "arctic"):
            b = results.get(base, {}).get(fig) if isinstance(results.get(base), dict) else None
            b = RECORDED_TRIE.get(fig) if b is None and base == "trie" else b
            v = new.get(fig)
            line += f"{v / b:>10.2f}x" if v and b else f"{'-':>11}"
        v = new.get(fig)
        ok = v is not None and (v <= target if better == "low" else v >= target)
        line += f"  {'<=' if better == 'low' else '>='} {target:g} {'OK' if ok else 'MISSED'}"
        print(line)
    print("r: recorded, not measured: today's trie store (CacheStore) was removed; docs/benchmarks.md")
    for k in KINDS:
        if isinstance(results.get(k), str):
            print(f"{k}: {results[k]}")


def bench_scale(quick: bool = False, max_trie_tokens: int = 200_000, kinds: tuple = KINDS) -> dict:
    cfg = {**(QUICK if quick else FULL), "max_trie_tokens": max_trie_tokens}
    print(f"scale: {cfg['responses']} x {cfg['length']}-token responses, depth 64; commits with {cfg['responses']} "
          f"('16') and {cfg['big']} ('256') stored; replay {cfg['steps']} steps x {cfg['prompts']} prompts x "
          f"K={cfg['k']}, each prompt back every {cfg['epoch']} steps (quick={quick}); today's trie only up to "
          f"{max_trie_tokens:,} tokens" + ("; targets apply to the full run" if quick else ""))
    results: dict = {"config": cfg}
    for kind in kinds:
        results[kind] = run_child(kind, cfg) if make_kind(kind, probe=True) else "not installed (pip install '.[bench]')"
    report(results)
    return results


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "--child":
    print(json.dumps(child(sys.argv[2], json.loads(sys.argv[3]))))
