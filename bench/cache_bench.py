"""The tree cache at long-CoT scale: srt's suffix tree with the sequence store, without and
with p-hat, beside ArcticInference's suffix tree. Not a test: it prints figures next to their
targets and ratios against ArcticInference measured in the same run.

    .venv/bin/python bench/cache_bench.py --scale [--quick] [--kinds new,new-p,arctic] [--json]

The kinds (`--kinds`, default all):
- `new`: `cache_store.suffix_tree.SuffixTree` persisted by the sequence store
  (`cache_store.seqstore.LmdbSequenceStore`: a commit appends the responses);
- `new-p`: `new` with the policy's probability of every token (p-hat) in the tree and in the
  store, as `srt rollout` keeps them when it samples; the probabilities are synthetic
  (`token_probs` in bench/workloads.py);
- `arctic`: ArcticInference's suffix tree (`pip install '.[bench]'`; skipped with a note where
  it is not installed), persisted the same way as `new` (it has no store of its own), drafting
  with `speculate(max_spec_tokens=16)`.

The workload (bench/workloads.py): one prompt's responses are noisy copies of a few reasoning
paths, 8,192 tokens each, 16 stored, depth 64. Each kind runs in a child process of its own, so
resident memory is measured per kind. Figures: memory per stored token, insert rate (streamed 4
tokens at a time, as verified tokens arrive), draft and draft-tree latency at budget 16, load
from LMDB until the first draft, commit of one new response with 16 and with 256 stored, disk
bytes per token, and a replay of an RL run's cache traffic: each step serves `prompts` prompts;
a prompt comes back every `epoch` steps with K new responses. Per prompt, as the srt drafter
does: load its tree at group start, open K samples, and until each sample has all its tokens,
interleaved: draft 16 tokens from the last 64 of its context, accept the prefix that agrees
with the real response plus one token (the target model's own), stream those in; commit at
group end. Only the tree and store calls are timed ("host seconds of tree work").
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workloads import make_prompt, noisy_copy, token_probs, zipf_tokens  # noqa: E402

KINDS = ("new", "new-p", "arctic")
DEPTH, BUDGET, MIN_PROB = 64, 16, 0.1
TARGETS = {  # figure -> (target, "low" if lower is better)
    "bytes_per_token": (100.0, "low"), "rss_bytes_per_token": (100.0, "low"), "insert_tokens_per_s": (1.5e6, "high"),
    "draft_p50_us": (5.0, "low"), "draft_p99_us": (30.0, "low"), "draft_tree_p50_us": (10.0, "low"),
    "load_first_draft_ms": (50.0, "low"), "commit_ms_16": (5.0, "low"), "commit_ms_256": (10.0, "low"),
    "disk_bytes_per_token": (16.0, "low"), "replay_s_per_step": (0.5, "low"), "replay_peak_rss_gb": (4.0, "low"),
}
FULL = dict(responses=16, length=8192, paths=3, big=256, steps=20, prompts=16, k=16, epoch=4)
QUICK = dict(responses=4, length=1024, paths=3, big=16, steps=2, prompts=2, k=4, epoch=2)


# -- the kinds, behind one small interface ----------------------------------------------------


class New:
    """The suffix tree and the sequence store."""

    def __init__(self) -> None:
        from cache_store.suffix_tree import SuffixTree

        self.tree = SuffixTree(DEPTH)

    def prepare(self, chunks: list[list[int]]) -> list:
        """What `stream_all` takes for one response's chunks (made before the timed insert)."""
        return chunks

    def stream_all(self, chunks: list[list[int]]) -> None:
        s = self.tree.stream()
        for c in chunks:
            s.extend(c)
        s.close()

    def memory_bytes(self) -> int:
        return self.tree.memory_bytes()

    def trim(self) -> None:
        if hasattr(self.tree, "trim"):
            self.tree.trim()

    def draft(self, ctx: list[int]) -> Any:
        return self.tree.draft(ctx, BUDGET, MIN_PROB)

    def draft_tree(self, ctx: list[int]) -> Any:
        return self.tree.draft_tree(ctx, BUDGET, MIN_PROB)

    def open_store(self, path: str) -> Any:
        from cache_store.seqstore import LmdbSequenceStore

        return LmdbSequenceStore.open(path)

    def _probs(self, tokens: list[int] | np.ndarray) -> list[float] | None:
        """The probabilities stored with these tokens: none here (`NewP` has them)."""
        return None

    def commit_responses(self, store: Any, uid: str, responses: list[np.ndarray]) -> None:
        store.append_many({self._uid(uid): responses}, {self._uid(uid): [self._probs(r) for r in responses]})

    def load(self, store: Any, uid: str) -> None:
        from cache_store.store import load_tree

        self.tree = load_tree(store, self._uid(uid), DEPTH)

    def disk_bytes(self, store: Any, uid: str) -> int:
        return store.stats(verify=False).record_bytes

    def close_store(self, store: Any) -> None:
        store.close()

    @staticmethod
    def _uid(uid: str) -> str:
        return uid.encode().hex().ljust(32, "0")[:32]

    # the replay: one group of K samples per prompt
    def begin_group(self, store: Any, uid: str) -> Any:
        self.load(store, uid)
        return self.tree

    def open_sample(self, group: Any) -> Any:
        return group.stream()

    def extend_sample(self, sample: Any, tokens: list[int]) -> None:
        sample.extend(tokens, self._probs(tokens))

    def draft_in(self, group: Any, sample: Any, ctx: list[int]) -> list[int]:
        return sample.draft(BUDGET, MIN_PROB).tokens  # matched from the stream's own windows

    def end_group(self, store: Any, uid: str, group: Any, samples: list) -> None:
        for s in samples:
            s.close()
        ids = [s.sequence_id for s in samples]
        store.append_many({self._uid(uid): [group.sequence(i) for i in ids]},
                          {self._uid(uid): [group.sequence_probs(i) for i in ids]})


class NewP(New):
    """`New` storing p-hat: streamed with each chunk's probabilities, committed with them."""

    POOL = 1 << 20

    def __init__(self) -> None:
        super().__init__()
        # drawn once, handed out in turn: the timed work is the tree's and the store's, not the draw
        self.pool, self.at = token_probs(np.random.default_rng(5), self.POOL + 65_536), 0

    def _probs(self, tokens: list[int] | np.ndarray) -> list[float]:
        n = len(tokens)
        if self.at + n > len(self.pool):
            self.at = 0
        self.at += n
        return self.pool[self.at - n:self.at].tolist()

    def prepare(self, chunks: list[list[int]]) -> list:
        return [(c, self._probs(c)) for c in chunks]

    def stream_all(self, chunks: list) -> None:
        s = self.tree.stream()
        for c, p in chunks:
            s.extend(c, p)
        s.close()


class Arctic(New):
    """ArcticInference's suffix tree, its responses kept in the sequence store."""

    def __init__(self) -> None:
        from arctic_inference.suffix_decoding._C import SuffixTree

        self.A = SuffixTree
        self.tree = SuffixTree(DEPTH)
        self.next_id = 0

    def stream_all(self, chunks: list[list[int]]) -> None:
        sid, self.next_id = self.next_id, self.next_id + 1
        for c in chunks:
            self.tree.extend(sid, c)

    def memory_bytes(self) -> int:
        return self.tree.estimate_memory()

    def draft(self, ctx: list[int]) -> Any:
        return self.tree.speculate(ctx, BUDGET, 1000.0, 0.0, MIN_PROB, False)

    def draft_tree(self, ctx: list[int]) -> Any:
        return self.tree.speculate(ctx, BUDGET, 1000.0, 0.0, MIN_PROB, True)

    def load(self, store: Any, uid: str) -> None:
        self.tree, self.next_id = self.A(DEPTH), 0
        for s in store.read(self._uid(uid)):
            self.stream_all([s.tokens.tolist()])

    def begin_group(self, store: Any, uid: str) -> Any:
        self.load(store, uid)
        return self

    def open_sample(self, group: Any) -> Any:
        sid, self.next_id = self.next_id, self.next_id + 1
        return [sid, []]

    def extend_sample(self, sample: Any, tokens: list[int]) -> None:
        self.tree.extend(sample[0], tokens)
        sample[1].extend(tokens)

    def draft_in(self, group: Any, sample: Any, ctx: list[int]) -> list[int]:
        return list(self.draft(ctx).token_ids)

    def end_group(self, store: Any, uid: str, group: Any, samples: list) -> None:
        store.append(self._uid(uid), [s[1] for s in samples])


MAKE = {"new": New, "new-p": NewP, "arctic": Arctic}


def installed(kind: str) -> bool:
    if kind != "arctic":
        return True
    try:
        import arctic_inference.suffix_decoding._C  # noqa: F401
    except ImportError:
        return False
    return True


# -- one kind's figures (in a child process of its own) ---------------------------------------


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
    k = MAKE[kind]()  # before the baseline: its fixed set-up is not per stored token
    chunks = [k.prepare(cs) for cs in chunks]
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.process_time()
    for cs in chunks:
        k.stream_all(cs)
    ins = time.process_time() - t0
    out = {"tokens": tokens, "insert_tokens_per_s": tokens / ins, "rss_bytes_per_token": (rss_bytes() - rss0) / tokens,
           "untrimmed_bytes_per_token": k.memory_bytes() / tokens}
    k.trim()  # as a loaded tree is (the suffix tree gives back growth room; ArcticInference's keeps it)
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
            k = MAKE[kind]()
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


def _accepted(draft: list[int], truth: list[int], pos: int) -> int:
    n = 0
    while n < len(draft) and pos + n < len(truth) and draft[n] == truth[pos + n]:
        n += 1
    return n


def _group(k: New, store: Any, uid: str, responses: list[list[int]]) -> tuple[float, int, int]:
    """Serve one group; (tree seconds, forwards, tokens)."""
    t0 = time.perf_counter()
    group = k.begin_group(store, uid)
    samples = [k.open_sample(group) for _ in responses]
    t = time.perf_counter() - t0
    pos = [0] * len(responses)
    forwards = 0
    while live := [i for i, r in enumerate(responses) if pos[i] < len(r)]:
        for i in live:
            r, p = responses[i], pos[i]
            ctx = r[max(0, p - 64):p]
            t0 = time.perf_counter()
            draft = k.draft_in(group, samples[i], ctx) if ctx else []
            t += time.perf_counter() - t0
            chunk = r[p:p + _accepted(draft, r, p) + 1]
            t0 = time.perf_counter()
            k.extend_sample(samples[i], chunk)
            t += time.perf_counter() - t0
            pos[i] += len(chunk)
            forwards += 1
    t0 = time.perf_counter()
    k.end_group(store, uid, group, samples)
    t += time.perf_counter() - t0
    return t, forwards, sum(map(len, responses))


def _responses(prompt: int, seed: int, cfg: dict) -> list[np.ndarray]:
    """K responses of `prompt` on one visit: the prompt's paths, fresh noise."""
    base_rng = np.random.default_rng(prompt)
    paths = [zipf_tokens(base_rng, int(cfg["length"] * 1.6) + 64) for _ in range(cfg["paths"])]
    rng = np.random.default_rng(seed + 7)
    return [noisy_copy(rng, paths, cfg["length"]) for _ in range(cfg["k"])]


def replay(kind: str, cfg: dict) -> dict:
    """An RL run's cache traffic: host seconds of tree work per step, tokens per forward, peak RSS."""
    k = MAKE[kind]()
    per_step, forwards, tokens = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        store = k.open_store(f"{tmp}/replay")
        for step in range(cfg["steps"]):
            visit, first = divmod(step, cfg["epoch"])
            seconds = 0.0
            for j in range(cfg["prompts"]):
                p = first * cfg["prompts"] + j
                rng_seed = 1000 * p + visit  # new samples on each visit, same reasoning paths
                resp = [a.tolist() for a in _responses(p, rng_seed, cfg)]
                s, f, n = _group(k, store, f"prompt{p}", resp)
                seconds, forwards, tokens = seconds + s, forwards + f, tokens + n
            per_step.append(seconds)
        k.close_store(store)
    return {"replay_s_per_step": float(np.mean(per_step)), "replay_last_step_s": per_step[-1],
            "replay_tokens_per_forward": tokens / max(1, forwards),
            "replay_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30}


def child(kind: str, cfg: dict) -> dict:
    return {"kind": kind, **measure_tree(kind, cfg), **measure_store(kind, cfg), **replay(kind, cfg)}


# -- the comparison ----------------------------------------------------------------------------


def run_child(kind: str, cfg: dict) -> dict | str:
    p = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(cfg)], capture_output=True, text=True)
    if p.returncode != 0:
        return f"failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def report(results: dict) -> None:
    kinds = [k for k in KINDS if isinstance(results.get(k), dict)]
    print(f"{'figure':<24}" + "".join(f"{k:>14}" for k in kinds) + f"{'new/arctic':>11}  target")
    new = results.get("new", {}) if isinstance(results.get("new"), dict) else {}
    arctic = results.get("arctic", {}) if isinstance(results.get("arctic"), dict) else {}
    for fig, (target, better) in TARGETS.items():
        line = f"{fig:<24}" + "".join(f"{results[k][fig]:>14,.2f}" if fig in results[k] else f"{'-':>14}"
                                      for k in kinds)
        v, b = new.get(fig), arctic.get(fig)
        line += f"{v / b:>10.2f}x" if v and b else f"{'-':>11}"
        ok = v is not None and (v <= target if better == "low" else v >= target)
        line += f"  {'<=' if better == 'low' else '>='} {target:g} {'OK' if ok else 'MISSED'}"
        print(line)
    for k in KINDS:
        if isinstance(results.get(k), str):
            print(f"{k}: {results[k]}")


def bench_scale(quick: bool = False, kinds: tuple = KINDS) -> dict:
    cfg = dict(QUICK if quick else FULL)
    print(f"scale: {cfg['responses']} x {cfg['length']}-token responses, depth {DEPTH}; commits with "
          f"{cfg['responses']} ('16') and {cfg['big']} ('256') stored; replay {cfg['steps']} steps x "
          f"{cfg['prompts']} prompts x K={cfg['k']}, each prompt back every {cfg['epoch']} steps (quick={quick})"
          + ("; targets apply to the full run" if quick else ""))
    results: dict = {"config": cfg}
    for kind in kinds:
        results[kind] = run_child(kind, cfg) if installed(kind) else "not installed (pip install '.[bench]')"
    report(results)
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", action="store_true", help="the long-CoT scale run (the only one: the default too)")
    ap.add_argument("--quick", action="store_true", help="a small workload (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--kinds", default=None, help=f"which trees, comma-separated (default: {','.join(KINDS)})")
    args = ap.parse_args(argv)
    kinds = tuple(args.kinds.split(",")) if args.kinds else KINDS
    if unknown := set(kinds) - set(KINDS):
        ap.error(f"--kinds: unknown {', '.join(sorted(unknown))} (known: {', '.join(KINDS)})")
    results = {"scale": bench_scale(quick=args.quick, kinds=kinds)}
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], json.loads(sys.argv[3]))))
    else:
        main()
