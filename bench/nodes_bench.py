"""One cache for every machine: node-local LMDB caches against one shared Redis cache, measured
with real `srt rollout` processes.

A multi-node RL run shuffles its prompts every epoch and deals them to the machines, so a
prompt lands on a different machine each epoch and a cache local to one machine holds about
1/N of that prompt's history. This bench replays that: the bundled model on the first
`--prompts` prompts of examples/arith/prompts.jsonl, K = `-n` samples, temperature 1, epochs
0..E-1; each epoch the prompts are shuffled (seeded by the epoch and `--seed`) and dealt
round-robin to `--nodes` nodes, and every node is its own `srt rollout --json` process on its
share (a prompts file of its own), the nodes of an epoch running at once, as real nodes do.
Side by side, epochs interleaved (each epoch runs every config before the next epoch starts):

- `local`: each node its own LMDB cache directory, kept across epochs;
- `redis`: every node the same cache on a `redis-server` the bench starts on 127.0.0.1 at a
  free port (no persistence: `--save '' --appendonly no`) and stops at the end, each cache a
  prefix of its own (`redis://127.0.0.1:PORT/0?prefix=NAME`);
- `one`: one machine, one process per epoch over all the prompts (in the epoch's shuffled
  order), one LMDB cache: the reference;
- `one-redis`: the same as `one` with the cache on the server: the same work as `one` (the
  bench checks the forward counts agree), so its wall time against `one`'s is the server's
  cost against LMDB's.

Every process gets the same options (`--seed` + epoch, so each epoch draws fresh samples, and
the rollout defaults: `--batch-size`, `--rollout-batch`, tools, drafting, except `--draft-length
adaptive`, whose lengths depend on the seed alone where the default's follow timings); only `--cache` and
the prompts file differ. A prompt goes to one node per epoch, so no node reads what another
wrote in the same epoch, and `local`, `one` and `one-redis` are exact per seed. `redis` is not
while its nodes run at once: they share the cache's clock, which each ticks when it ends, and a
node's appends are stamped with the tick the clock shows then, so the stamps (and the decayed
weights a later epoch loads) depend on which nodes finished first. A weight moved by one tick's
decay (0.7% at the default half-life of 100 ticks) can change a sampled draft, and from there
every later draw: `redis`'s forward counts move between runs as another seed's do. `--serial`
(node after node) makes them exact per seed.

Printed per epoch and config: target forwards summed over the nodes (against `one`'s, and
against the config's own epoch 0), accepted tokens per row forward (pooled over the nodes, and
their min-max), wall time (srt's `wall_s`: generation with the cache's loads and appends; the
longest node's, and the sum over nodes; nodes simulated on one machine share its cores), the
longest process's wall with its start-up, and the cache hit rate. Then the ratios: the shared
and local caches' last-epoch forwards against one machine's (target: the shared cache within
3%), also divided by the same ratio at epoch 0, where every cache is cold and only the split
into engines differs; `one-redis`'s wall against `one`'s per epoch (target within 10%), and
with `--repeat N` (default 3) the last epoch of `one` and `one-redis` rerun N times each from a
copy of its cache before that epoch, the two alternating, for a median ratio that a drift of
the machine's speed moves less.

`--load` adds a store-level measurement: 16 rollouts of 8,192 tokens (synthetic, zipf-ish,
bench/workloads.py, with p-hat) stored for one prompt in an LMDB store and on the server; then
the bounded read a rollout does when it first needs the prompt (`store.read(uid, LOAD_NEWEST,
LOAD_TOKENS)`) and the whole `load_tree`, each timed `--load-repeats` times (default 20) with
the stores interleaved; medians and Redis / LMDB (target <= 1.5x). It also times `append_many`
of such a batch (16 x 8,192 tokens, a new prompt each time) on each.

    .venv/bin/python bench/nodes_bench.py --load                  # 4 nodes, 64 prompts, K 8, 4 epochs
    .venv/bin/python bench/nodes_bench.py --nodes 8 --prompts 128 --configs local,redis,one
    .venv/bin/python bench/nodes_bench.py --quick --load --json-out nodes.json   # a smoke run

`--json-out FILE` writes every node's summary, the per-epoch figures, the ratios and the load
figures. Needs `redis-server` on the PATH (started as the tests start it,
`tests/cache_store/redis_server.py`) for the Redis configs and
`--load`. Not a test; wall times are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cache_store.redis_server import BINARY, NO_SERVER, RedisServer, server_version  # noqa: E402

CONFIGS = ("local", "redis", "one", "one-redis")
NODE_CONFIGS = ("local", "redis")  # the configs dealt to nodes; the others run on one machine
REDIS_CONFIGS = ("redis", "one-redis")
TARGETS = {"shared_vs_one_forwards": 0.03, "redis_vs_lmdb_wall": 0.10, "redis_vs_lmdb_load": 1.5}
QUICK = {"prompts": 8, "nodes": 2, "n": 2, "epochs": 2, "max_new_tokens": 24, "repeat": 1,
         "load_responses": 4, "load_length": 1024, "load_repeats": 3}
FULL_LOAD = {"load_responses": 16, "load_length": 8192}


# -- the workload ---------------------------------------------------------------------------

def deal(prompts: int, nodes: int, epoch: int, seed: int = 0) -> list[list[int]]:
    """Each node's prompts (indices into the prompt list) in one epoch: the prompts shuffled by
    (seed, epoch), then dealt round-robin, node j taking the j-th, (j + nodes)-th, ... of the
    shuffled order. Every prompt goes to exactly one node; the deal is the same for the same
    arguments in any process."""
    order = shuffled(prompts, epoch, seed)
    return [order[j::nodes] for j in range(nodes)]


def shuffled(prompts: int, epoch: int, seed: int = 0) -> list[int]:
    """The epoch's order of the prompts (what one machine's sampler would give)."""
    order = list(range(prompts))
    random.Random(f"srt-nodes-bench:{seed}:{epoch}").shuffle(order)
    return order


def write_prompts(lines: list[str], picked: list[int], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines[i] + "\n" for i in picked))
    return path


def srt_command() -> list[str]:
    """The `srt` command of this Python (its venv's script, else `python -m srtcli`)."""
    script = Path(sys.executable).parent / "srt"
    return [str(script)] if script.exists() else [sys.executable, "-m", "srtcli"]


# -- the cache server -----------------------------------------------------------------------

def rollout_args(args: argparse.Namespace, prompts: Path, cache: str, out: Path, epoch: int) -> list[str]:
    """One `srt rollout` command: the same options for every node and config."""
    cmd = [*srt_command(), "rollout", "--prompts", str(prompts), "--cache", cache, "--out", str(out),
           "-n", str(args.n), "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature),
           "--seed", str(args.seed + epoch), "--device", "cpu", "--threads", "1", "--tool-workers", "0",
           "--draft-length", "adaptive", "--json"]  # lengths by the seed alone: nodes and configs comparable
    return cmd + (["--model", args.model] if args.model else [])


def run_processes(cmds: list[list[str]], logs: list[Path], serial: bool = False) -> list[dict]:
    """Run the commands at once (or one after another), each to its end; their JSON summaries,
    each with `process_s`, its wall time from the start of the process to its exit."""
    procs: list[tuple[subprocess.Popen, float]] = []
    out: list[dict] = []

    def finish(p: subprocess.Popen, t0: float, log: Path) -> dict:
        stdout, _ = p.communicate()
        took = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(p.args)} failed ({p.returncode}):\n{log.read_text()[-2000:]}")
        return {**json.loads(stdout.strip().splitlines()[-1]), "process_s": round(took, 3)}

    for cmd, log in zip(cmds, logs):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(log.parent))
        if serial:
            out.append(finish(p, t0, log))
        else:
            procs.append((p, t0))
    try:
        return out + [finish(p, t0, log) for (p, t0), log in zip(procs, logs)]
    finally:
        for p, _ in procs:  # a node failed: stop the others of its epoch
            if p.poll() is None:
                p.kill()
                p.wait()


def aggregate(nodes: list[dict]) -> dict:
    """One config's epoch from its nodes' summaries."""
    acc = [s["accepted_per_forward"] for s in nodes]
    tokens, prompts = sum(s["generated_tokens"] for s in nodes), sum(s["prompts"] for s in nodes)
    rows = sum(s["generated_tokens"] / s["accepted_per_forward"] for s in nodes)  # (sequence, forward) pairs
    return {"target_forwards": sum(s["target_forwards"] for s in nodes), "generated_tokens": tokens,
            "accepted_pooled": round(tokens / rows, 4), "accepted_min": min(acc), "accepted_max": max(acc),
            "wall_max": max(s["wall_s"] for s in nodes), "wall_sum": round(sum(s["wall_s"] for s in nodes), 3),
            "process_max": max(s["process_s"] for s in nodes),
            "cache_hit": round(sum(s["cache_hit_rate"] * s["prompts"] for s in nodes) / prompts, 4),
            "cache_hit_min": min(s["cache_hit_rate"] for s in nodes), "nodes": nodes}


class Bench:
    """The caches, prompts and processes of one invocation."""

    def __init__(self, args: argparse.Namespace, work: Path, server: RedisServer | None) -> None:
        self.args, self.work, self.server = args, work, server
        lines = [ln for ln in Path(args.prompts_file).read_text().splitlines() if ln.strip()]
        if len(lines) < args.prompts:
            raise SystemExit(f"{args.prompts_file} has {len(lines)} prompts, not {args.prompts}")
        self.lines = lines[: args.prompts]
        self.run_id = uuid.uuid4().hex[:8]  # the Redis prefixes of this invocation: never a stale cache

    def cache(self, config: str, node: int = 0, tag: str = "") -> str:
        """The --cache of `config` (for node `node`; `tag` names a copy for --repeat)."""
        if config == "local":
            return str(self.work / "caches" / f"local-node{node}")
        if config == "one":
            return str(self.work / "caches" / f"one{tag}")
        return self.server.url(f"nb{self.run_id}-{config}{tag}")

    def epoch(self, config: str, epoch: int, tag: str = "") -> dict:
        """Run one config's epoch (all its nodes); its aggregate."""
        a = self.args
        shares = deal(a.prompts, a.nodes, epoch, a.seed) if config in NODE_CONFIGS else \
            [shuffled(a.prompts, epoch, a.seed)]
        cmds, logs = [], []
        for j, share in enumerate(shares):
            d = self.work / "runs" / f"{config}{tag}-e{epoch}-node{j}"
            prompts = write_prompts(self.lines, share, d / "prompts.jsonl")
            cmds.append(rollout_args(a, prompts, self.cache(config, j, tag), d / "pool", epoch))
            logs.append(d / "stderr.log")
        return aggregate(run_processes(cmds, logs, serial=a.serial))

    def snapshot(self, config: str) -> None:
        """A copy of `config`'s cache as it is now (before the last epoch), for --repeat."""
        self._copy(config, "", "-snap")

    def restore(self, config: str, tag: str) -> None:
        """A fresh cache `tag` from the snapshot."""
        self._copy(config, "-snap", tag)

    def _copy(self, config: str, src: str, dst: str) -> None:
        if config == "one":
            shutil.rmtree(self.cache(config, tag=dst), ignore_errors=True)
            shutil.copytree(self.cache(config, tag=src), self.cache(config, tag=dst))
            return
        from cache_store.locations import export_store, open_store

        with open_store(self.cache(config, tag=src), create=False) as store:
            export_store(store, self.cache(config, tag=dst))  # the clock, settings and every record


# -- the report -------------------------------------------------------------------------------

def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def figures(results: dict[str, list[dict]], repeats: dict[str, list[dict]]) -> dict:
    """The ratios the targets ask for, and what explains them."""
    last = {c: r[-1] for c, r in results.items()}
    fw = {c: s["target_forwards"] for c, s in last.items()}
    out: dict[str, Any] = {f"{c}_last_vs_epoch0_forwards": ratio(fw[c], r[0]["target_forwards"])
                           for c, r in results.items()}
    if "one" in fw:
        for c in NODE_CONFIGS:
            if c in fw:
                out[f"{c}_vs_one_forwards"] = ratio(fw[c], fw["one"])
                out[f"{c}_vs_one_forwards_epoch0"] = ratio(results[c][0]["target_forwards"],
                                                           results["one"][0]["target_forwards"])
                out[f"{c}_vs_one_accepted"] = ratio(last[c]["accepted_pooled"], last["one"]["accepted_pooled"])
    if "redis" in fw and "local" in fw:
        out["redis_vs_local_forwards"] = ratio(fw["redis"], fw["local"])
        out["local_equals_redis_epoch0"] = (results["local"][0]["target_forwards"] ==
                                            results["redis"][0]["target_forwards"])
    if "one" in results and "one-redis" in results:
        one, red = results["one"], results["one-redis"]
        out["one_redis_same_work"] = [a["target_forwards"] == b["target_forwards"] and
                                      a["generated_tokens"] == b["generated_tokens"] for a, b in zip(one, red)]
        out["one_redis_vs_one_wall"] = [ratio(b["wall_max"], a["wall_max"]) for a, b in zip(one, red)]
        out["one_redis_vs_one_process"] = [ratio(b["process_max"], a["process_max"]) for a, b in zip(one, red)]
        if repeats.get("one") and repeats.get("one-redis"):
            rounds = [ratio(b["wall_max"], a["wall_max"]) for a, b in zip(repeats["one"], repeats["one-redis"])]
            out["one_redis_vs_one_wall_rounds"] = rounds
            out["one_redis_vs_one_wall_median"] = statistics.median(rounds)
            out["one_redis_vs_one_wall_medians"] = ratio(statistics.median(b["wall_max"] for b in repeats["one-redis"]),
                                                         statistics.median(a["wall_max"] for a in repeats["one"]))
    return out


def print_tables(results: dict[str, list[dict]], nodes: int) -> None:
    epochs = len(next(iter(results.values())))
    print("\nper epoch: target forwards (summed over nodes; against one's, and against the config's own epoch "
          "0), accepted tokens per row forward (pooled over nodes; min-max over nodes), wall s (srt's wall_s: "
          "the longest node, the sum over nodes), the longest process s (with start-up), cache hit rate (all prompts)")
    print(f"{'epoch':>5s}  {'config':9s} {'nodes':>5s} {'forwards':>8s} {'x one':>6s} {'x e0':>6s}  "
          f"{'acc/fwd':>7s} {'min-max':>11s}  {'wall max':>8s} {'wall sum':>8s} {'process':>8s} {'tokens':>7s} "
          f"{'hit':>5s}")
    for e in range(epochs):
        one = results["one"][e]["target_forwards"] if "one" in results else 0
        for c, r in results.items():
            s = r[e]
            acc = f"{s['accepted_min']:.2f}-{s['accepted_max']:.2f}" if c in NODE_CONFIGS else ""
            n = nodes if c in NODE_CONFIGS else 1
            print(f"{e:5d}  {c:9s} {n:5d} {s['target_forwards']:8d} {ratio(s['target_forwards'], one):6.3f} "
                  f"{ratio(s['target_forwards'], r[0]['target_forwards']):6.3f}  {s['accepted_pooled']:7.3f} "
                  f"{acc:>11s}  {s['wall_max']:8.2f} {s['wall_sum']:8.2f} {s['process_max']:8.2f} "
                  f"{s['generated_tokens']:7d} {s['cache_hit']:5.2f}")


def print_figures(f: dict, epochs: int) -> None:
    last = epochs - 1
    print()
    for c in NODE_CONFIGS:
        if f"{c}_vs_one_forwards" in f:
            target = f" (target within {TARGETS['shared_vs_one_forwards']:.0%})" if c == "redis" else ""
            e0 = f[f"{c}_vs_one_forwards_epoch0"]
            print(f"epoch {last} forwards, {c} / one: {f[f'{c}_vs_one_forwards']:.3f}{target}; at epoch 0, every "
                  f"cache cold: {e0:.3f}, so {f[f'{c}_vs_one_forwards'] / e0:.3f} of that; accepted per row "
                  f"forward {c} / one: {f[f'{c}_vs_one_accepted']:.3f}")
    print(f"epoch {last} forwards against epoch 0's: " +
          ", ".join(f"{k[: -len('_last_vs_epoch0_forwards')]} {v:.3f}"
                    for k, v in f.items() if k.endswith("_last_vs_epoch0_forwards")))
    if "redis_vs_local_forwards" in f:
        print(f"epoch {last} forwards, redis / local: {f['redis_vs_local_forwards']:.3f}; the same at epoch 0: "
              f"{f['local_equals_redis_epoch0']}")
    if "one_redis_vs_one_wall" in f:
        same = "yes" if all(f["one_redis_same_work"]) else f"NO {f['one_redis_same_work']}"
        print(f"one-redis / one, wall per epoch: {' '.join(f'{x:.3f}' for x in f['one_redis_vs_one_wall'])} "
              f"(target within {TARGETS['redis_vs_lmdb_wall']:.0%}); process wall: "
              f"{' '.join(f'{x:.3f}' for x in f['one_redis_vs_one_process'])}; the same work (forwards, "
              f"tokens): {same}")
    if "one_redis_vs_one_wall_median" in f:
        rounds = " ".join(f"{x:.3f}" for x in f["one_redis_vs_one_wall_rounds"])
        print(f"one-redis / one, epoch {last} repeated: median of rounds {f['one_redis_vs_one_wall_median']:.3f} "
              f"[{rounds}]; ratio of medians {f['one_redis_vs_one_wall_medians']:.3f}")


# -- the store-level load -------------------------------------------------------------------

def measure_load(server: RedisServer, work: Path, responses: int, length: int, repeats: int) -> dict:
    """Bounded read, load_tree and append_many of `responses` x `length` tokens, LMDB against
    the server, interleaved; medians in ms."""
    import numpy as np

    from bench.workloads import make_prompt, token_probs
    from cache_store.redis_store import RedisSequenceStore
    from cache_store.seqstore import LmdbSequenceStore
    from cache_store.store import LOAD_NEWEST, LOAD_TOKENS, load_tree

    data = make_prompt(7, responses, length, 3)
    rng = np.random.default_rng(7)
    probs = [token_probs(rng, r.size) for r in data]
    uid = "ab" * 16
    stores = {"lmdb": LmdbSequenceStore.open(work / "load-lmdb"),
              "redis": RedisSequenceStore.open(server.url(f"nbload{uuid.uuid4().hex[:8]}"))}
    times: dict[str, dict[str, list[float]]] = {k: {"read": [], "load_tree": [], "append_many": []} for k in stores}
    try:
        for s in stores.values():
            s.append_many({uid: data}, {uid: probs})
        stored = {k: sum(x.tokens.size for x in s.read(uid, LOAD_NEWEST, LOAD_TOKENS)) for k, s in stores.items()}
        for i in range(repeats):
            for k in (("lmdb", "redis") if i % 2 == 0 else ("redis", "lmdb")):
                s = stores[k]
                t0 = time.perf_counter()
                s.read(uid, LOAD_NEWEST, LOAD_TOKENS)
                t1 = time.perf_counter()
                load_tree(s, uid)
                t2 = time.perf_counter()
                fresh = f"{i:08x}" + uuid.uuid4().hex[8:]  # a new prompt each append
                s.append_many({fresh: data}, {fresh: probs})
                t3 = time.perf_counter()
                for name, dt in (("read", t1 - t0), ("load_tree", t2 - t1), ("append_many", t3 - t2)):
                    times[k][name].append(dt * 1e3)
    finally:
        for s in stores.values():
            s.close()
    med = {k: {n: statistics.median(v) for n, v in t.items()} for k, t in times.items()}
    return {"responses": responses, "length": length, "repeats": repeats, "tokens_read": stored,
            "median_ms": med, "ms": times,
            "redis_vs_lmdb": {n: ratio(med["redis"][n], med["lmdb"][n]) for n in med["lmdb"]}}


def print_load(f: dict) -> None:
    print(f"\nstore-level, one prompt of {f['responses']} x {f['length']} tokens (with p-hat), medians of "
          f"{f['repeats']} interleaved rounds, ms")
    print(f"{'':30s} {'LMDB':>9s} {'Redis':>9s} {'Redis / LMDB':>13s}")
    names = {"read": "bounded read (LOAD_TOKENS)", "load_tree": "load_tree (read + build)",
             "append_many": "append_many (a new prompt)"}
    for n, label in names.items():
        target = f"   target <= {TARGETS['redis_vs_lmdb_load']}x" if n == "read" else ""
        print(f"{label:30s} {f['median_ms']['lmdb'][n]:9.2f} {f['median_ms']['redis'][n]:9.2f} "
              f"{f['redis_vs_lmdb'][n]:12.2f}x{target}")


# -- main -------------------------------------------------------------------------------------

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64, help="the first N prompts of --prompts-file")
    ap.add_argument("--prompts-file", default=str(ROOT / "examples/arith/prompts.jsonl"))
    ap.add_argument("--model", help="a model directory (default: the bundled model)")
    ap.add_argument("-n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="the deals and the samples (each epoch: seed + epoch)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"any of {','.join(CONFIGS)}")
    ap.add_argument("--serial", action="store_true", help="run the nodes of an epoch one after another, not at once")
    ap.add_argument("--repeat", type=int, default=3, metavar="N",
                    help="rerun the last epoch of one and one-redis N times each from their caches before it")
    ap.add_argument("--load", action="store_true", help="also the store-level load measurement")
    ap.add_argument("--load-repeats", type=int, default=20)
    ap.add_argument("--work", help="a directory for the caches and pools (default: a temporary one, removed)")
    ap.add_argument("--json-out")
    ap.add_argument("--quick", action="store_true", help="a smoke run (flags given win): " +
                    ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    args = ap.parse_args(argv)
    args.load_responses, args.load_length = FULL_LOAD["load_responses"], FULL_LOAD["load_length"]
    if args.quick:  # the quick values, where the command line left the default
        for k, v in QUICK.items():
            if k in FULL_LOAD or getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    args.configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configs {bad}: any of {','.join(CONFIGS)}")
    if (set(args.configs) & set(REDIS_CONFIGS) or args.load) and BINARY is None:
        ap.error(NO_SERVER)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="srt-nodes-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    server = RedisServer(work / "redis").start() \
        if set(args.configs) & set(REDIS_CONFIGS) or args.load else None
    started = time.time()
    try:
        out = run(args, work, server)
    finally:
        if server is not None:
            server.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    out["seconds"] = round(time.time() - started, 1)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    print(f"\ntook {out['seconds']:.0f} s")
    return out


def run(args: argparse.Namespace, work: Path, server: RedisServer | None) -> dict:
    bench = Bench(args, work, server)
    print(f"{args.prompts} prompts x {args.n} samples, {args.epochs} epochs, {args.nodes} nodes, configs "
          f"{','.join(args.configs)}" + (f"; redis-server {server_version()} on 127.0.0.1:{server.port}"
                                         if server else ""), flush=True)
    results: dict[str, list[dict]] = {c: [] for c in args.configs}
    repeat_configs = [c for c in ("one", "one-redis") if c in args.configs] if args.repeat else []
    for e in range(args.epochs):
        for c in args.configs[e % len(args.configs):] + args.configs[: e % len(args.configs)]:  # rotate
            if e == args.epochs - 1 and c in repeat_configs:
                bench.snapshot(c)
            s = bench.epoch(c, e)
            results[c].append(s)
            print(f"epoch {e} {c:9s} forwards {s['target_forwards']:5d}  acc/fwd {s['accepted_min']:.2f}-"
                  f"{s['accepted_max']:.2f}  wall max {s['wall_max']:6.2f}s sum {s['wall_sum']:6.2f}s  "
                  f"process max {s['process_max']:6.2f}s", flush=True)
    repeats: dict[str, list[dict]] = {c: [] for c in repeat_configs}
    for r in range(args.repeat if len(repeat_configs) == 2 else 0):
        for c in (repeat_configs if r % 2 == 0 else repeat_configs[::-1]):
            tag = f"-r{r}"
            bench.restore(c, tag)
            s = bench.epoch(c, args.epochs - 1, tag)
            if s["target_forwards"] != results[c][-1]["target_forwards"]:
                print(f"{c}: round {r} took {s['target_forwards']} forwards, the last epoch "
                      f"{results[c][-1]['target_forwards']}: not the same work")
            repeats[c].append(s)
            print(f"repeat {r} {c:9s} wall {s['wall_max']:6.2f}s", flush=True)
    f = None
    if args.epochs:  # `--epochs 0 --load`: the load measurement alone
        print_tables(results, args.nodes)
        f = figures(results, repeats)
        print_figures(f, args.epochs)
    load = None
    if args.load:
        load = measure_load(server, work, args.load_responses, args.load_length, args.load_repeats)
        print_load(load)
    return {"settings": {k: v for k, v in vars(args).items()},
            "redis_server": server_version() if server else None,
            "deals": {e: deal(args.prompts, args.nodes, e, args.seed) for e in range(args.epochs)},
            "results": results, "repeats": repeats, "figures": f, "load": load}


if __name__ == "__main__":
    main()
