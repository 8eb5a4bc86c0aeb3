"""Benchmark: time per optimizer step and peak memory of `srt train`, packed vs unpacked.

For each scenario (n sequences sharing a prompt of P tokens, each with its own branch of B
tokens: the packing design's 4/256/128, 8/1024/256, 4/1024/128), and optionally a real steps pool
(`--pool DIR`, e.g. from `srt rollout`), it times one full optimizer step (forward, backward,
AdamW) three ways, side by side in the same run, on the same random tiny Qwen2:

    packed  one prefix-tree row per group (tree attention), the `--shards` path
    padded  all sequences in one right-padded batch, the `--steps` path with a big micro-batch
    single  one sequence per forward (gradient accumulation), `--steps --micro-batch-tokens 0`

Times come from one process per scenario that interleaves the modes step by step (a shared
machine's load then hits every mode alike); peak memory comes from a fresh process per
(scenario, mode) running one step (CUDA: max allocated; CPU: max RSS growth over the loaded
model). With `--repeats 0` (for steps of minutes, as the real model's on a CPU) each mode's time
is that one step's, in its own process, with no warm-up. Printed: median step seconds, peak MiB,
the token ratio (packed / unpacked tokens), the time ratio packed / padded, and the target
`packed <= 1.2 x token ratio x padded`. Not a test: timings on a shared machine are noisy.

    .venv/bin/python bench/train_bench.py [--repeats 3] [--hidden 256] [--layers 4] [--pool DIR]

With `--model DIR` every scenario runs on that model instead (the real model:
`examples/smollm2/prepare.py`), `--gradient-checkpointing` checkpoints its layers in every mode
(`srt train --gradient-checkpointing`), `--micro-batch-tokens N` splits each mode's step into
micro-batches of N tokens and packs rows of N tokens as `srt pack` / `srt train` do by default
(8192), and `--scenarios` picks scenarios: `pool` (the pool as it is) and `fewshot` (the pool's
first `--fewshot-groups` groups, each sample's prompt behind one shared `--fewshot-tokens`-token
prefix standing for a system prompt with few-shot examples, made of the pool's own tokens) need
`--pool`.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCENARIOS = [(4, 256, 128), (8, 1024, 256), (4, 1024, 128)]
MODES = ("packed", "padded", "single")


def fewshot_steps(steps, prefix_tokens: int, groups: int):
    """The first `groups` groups of a pool, every sample's prompt behind one shared prefix of
    `prefix_tokens` tokens (the pool's own tokens, in order), which the loss does not train."""
    prefix = [t for s in steps for t in s.input_ids][:prefix_tokens]
    kept = list(dict.fromkeys(s.prompt_uid for s in steps))[:groups]
    out = []
    for s in steps:
        if s.prompt_uid in kept:
            s.input_ids = prefix + s.input_ids
            s.loss_mask = [0] * len(prefix) + s.loss_mask
            s.old_logprobs = [0.0] * len(prefix) + s.old_logprobs
            out.append(s)
    return out


def synthetic_steps(n: int, prefix: int, branch: int, vocab: int, seed: int = 0):
    from srtcli.pool import StepRecord

    rng = random.Random(seed)
    p = [rng.randrange(vocab) for _ in range(prefix)]
    steps = []
    for i in range(n):
        b = [rng.randrange(vocab) for _ in range(branch)]
        steps.append(StepRecord("p", f"t{i}", 0, p + b, [0] * prefix + [1] * branch,
                                [0.0] * prefix + [-3.0] * branch, float(i % 2)))
    return steps


def work_rows(steps, mode: str, row_tokens: int = 1 << 20):
    from attention import pack_rows
    from srtcli.advantages import grpo_advantages
    from srtcli.train.data import TrainSeq, WorkRow

    adv = grpo_advantages(steps)
    seqs = [TrainSeq.from_step(s, a) for s, a in zip(steps, adv)]
    if mode != "packed":
        return [WorkRow([s]) for s in seqs]
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        groups.setdefault(s.prompt_uid, []).append(i)
    order = [i for g in groups.values() for i in g]
    rows = pack_rows([[steps[i].input_ids for i in g] for g in groups.values()], max_tokens=row_tokens, pad_to=128)
    return [WorkRow([seqs[order[k]] for k in r.seq_ids], r) for r in rows]


def peak_mib(device: str, base_rss_kib: int) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss_kib) / 1024


def setup(args):
    """(model, steps, device, attn) for one scenario."""
    import torch

    from srtcli.pool import read_pool
    from srtcli.train.config import resolve_attn

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = bench_model(args).to(device).eval()
    if args.gradient_checkpointing:
        from attention.checkpointing import checkpoint_layers

        checkpoint_layers(model)
    vocab = model.config.vocab_size
    if args.scenario in ("pool", "fewshot"):
        steps = read_pool(Path(args.pool))
        for s in steps:  # a real pool's ids may exceed a random model's vocabulary
            s.input_ids = [t % vocab for t in s.input_ids]
        if args.scenario == "fewshot":
            steps = fewshot_steps(steps, args.fewshot_tokens, args.fewshot_groups)
    else:
        n, p, b = map(int, args.scenario.split("/"))
        steps = synthetic_steps(n, p, b, vocab)
    return model, steps, device, resolve_attn("auto", device)


def bench_model(args):
    """`--model`'s model (float32, as `srt train` loads it), or a random tiny Qwen2."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from srtcli.train.build import train_model

    if args.model:
        return train_model(Path(args.model), torch.float32, "sdpa", "cpu")
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg)


def one_step(model, opt, rows, mode: str, device: str, attn: str, micro_tokens: int = 1 << 30):
    """One full optimizer step; returns (seconds, StepResult)."""
    import torch

    from srtcli.train.dist import DistInfo
    from srtcli.train.loss import LossConfig
    from srtcli.train.step import step_gradients

    micro = 0 if mode == "single" else micro_tokens
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    res = step_gradients(model, None, rows, LossConfig(), micro, DistInfo(device=device), attn)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, res


def forward_tokens(rows, mode: str, micro_tokens: int) -> int:
    """Positions the step's forwards compute, padding included (a padded micro-batch runs
    every sequence at its longest one's length)."""
    from srtcli.train.data import micro_batches

    return sum(len(mb) * mb[0].cost for mb in micro_batches(rows, 0 if mode == "single" else micro_tokens))


def run_times(args) -> dict:
    """All modes of one scenario in one process, interleaved (packed, padded, single, packed,
    ...), so that load from other processes on a shared machine hits every mode alike."""
    import torch

    model, steps, device, attn = setup(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = {m: work_rows(steps, m, args.micro_batch_tokens) for m in MODES}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    out: dict[str, dict] = {}
    for i in range(args.repeats + args.warmup):  # the first rounds warm up (allocator, kernels)
        for m in MODES:
            secs, res = one_step(model, opt, rows[m], m, device, attn, args.micro_batch_tokens)
            if i >= args.warmup:
                times[m].append(secs)
            out[m] = step_figures(rows[m], m, res, args, device, attn)
    for m in MODES:
        out[m]["step_s"] = statistics.median(times[m])
    return out


def step_figures(rows, mode: str, res, args, device: str, attn: str) -> dict:
    return {"tokens": res.tokens, "packed_tokens": res.packed_tokens,
            "forward_tokens": forward_tokens(rows, mode, args.micro_batch_tokens), "device": device, "attn": attn}


def run_memory(args) -> dict:
    """Peak memory of one optimizer step of one mode (a fresh process per mode), and its time."""
    import torch

    model, steps, device, attn = setup(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = work_rows(steps, args.mode, args.micro_batch_tokens)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    secs, res = one_step(model, opt, rows, args.mode, device, attn, args.micro_batch_tokens)
    return {"peak_mib": peak_mib(device, base), "step_s": secs} | step_figures(rows, args.mode, res, args, device, attn)


def _child(args, sc: str, *extra: str) -> dict:
    cmd = [sys.executable, __file__, "--scenario", sc, "--repeats", str(args.repeats), "--hidden", str(args.hidden),
           "--layers", str(args.layers), "--vocab", str(args.vocab), "--threads", str(args.threads),
           "--warmup", str(args.warmup), "--micro-batch-tokens", str(args.micro_batch_tokens),
           "--fewshot-tokens", str(args.fewshot_tokens), "--fewshot-groups", str(args.fewshot_groups), *extra]
    cmd += ["--pool", args.pool] if args.pool else []
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--gradient-checkpointing"] if args.gradient_checkpointing else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (the machine is shared)")
    ap.add_argument("--pool", help="also run on a real steps pool (e.g. from `srt rollout`)")
    ap.add_argument("--model", help="a model directory to train instead of the random tiny Qwen2")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="checkpoint the model's layers")
    ap.add_argument("--micro-batch-tokens", type=int, default=1 << 30,
                    help="micro-batch and packed row size (default: the whole step in one micro-batch)")
    ap.add_argument("--scenarios", help="comma-separated: n/prefix/branch, pool, fewshot (default: all that apply)")
    ap.add_argument("--fewshot-tokens", type=int, default=1024)
    ap.add_argument("--fewshot-groups", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones")
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scenario:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(run_memory(args) if args.mode else run_times(args)))
        return
    scenarios = [f"{n}/{p}/{b}" for n, p, b in SCENARIOS] + (["pool", "fewshot"] if args.pool else [])
    if args.scenarios:
        scenarios = args.scenarios.split(",")
    what = args.model or f"Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}"
    print(f"model: {what}{' (gradient checkpointing)' if args.gradient_checkpointing else ''}; "
          f"median of {args.repeats} optimizer steps per mode, modes interleaved; {args.threads} thread(s)")
    print(f"{'scenario':<12} {'mode':<7} {'step s':>8} {'peak MiB':>9} {'fwd tokens':>10}")
    for sc in scenarios:
        res = _child(args, sc) if args.repeats else {}
        for mode in MODES:
            res[mode] = r = _child(args, sc, "--mode", mode) | res.get(mode, {})  # the interleaved times win
            print(f"{sc:<12} {mode:<7} {r['step_s']:>8.3f} {r['peak_mib']:>9.1f} {r['forward_tokens']:>10}")
        token_ratio = res["packed"]["packed_tokens"] / res["packed"]["tokens"]
        time_ratio = res["packed"]["step_s"] / res["padded"]["step_s"]
        ok = time_ratio <= 1.2 * token_ratio
        fwd_ratio = res["packed"]["forward_tokens"] / res["padded"]["forward_tokens"]
        print(f"{sc:<12} token ratio {token_ratio:.3f}  time packed/padded {time_ratio:.3f}  "
              f"packed/single {res['packed']['step_s'] / res['single']['step_s']:.3f}  "
              f"target <= {1.2 * token_ratio:.3f}: {'met' if ok else 'NOT met'}")
        print(f"{sc:<12} forward tokens packed/padded {fwd_ratio:.3f}  time target <= 1.15 x that = "
              f"{1.15 * fwd_ratio:.3f}: {'met' if time_ratio <= 1.15 * fwd_ratio else 'NOT met'}")


if __name__ == "__main__":
    main()
