"""`srt rollout`: speculative rollout of a prompts file into a steps pool.

Pieces: prompts.py reads and tokenizes the prompts; engine.py generates (KV cache, ragged
acceptance, continuous batching) with a drafter from drafters/ and verify.py; runahead.py
schedules rollout batches and the long-tail run-ahead; this module wires them together, runs
tools and rewards, writes one pool step per model turn (crash-safe, a whole group at a time,
fsynced), resumes a killed run, and prints the summary.

Pool file: `--out` itself if it ends in .jsonl, else `<out>/rollout.jsonl`. Every trajectory's
last step carries `meta.last = true` and `meta.group_size = K`; `--resume` keeps the groups
whose K trajectories are all complete, cuts any trailing partial group (or partial line), and
rolls out the rest. The pool is locked by its one writer for the whole run, and `--resume`
continues only the run the pool was started with (`pool_guard`, srtcli/rollout/pool_guard.py).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from srtcli.cli.config import config_option
from srtcli.rollout.drafters import DRAFTERS
from srtcli.cache import cache_dir, open_cache
from srtcli.errors import Interrupted, SrtError, at

# the summary keys docs/rollout.md promises (the JSON has these and a few more)
SUMMARY_KEYS = ("generated_tokens", "wall_s", "tokens_per_s", "target_forwards", "accepted_per_forward",
                "draft_acceptance_rate", "run_ahead_tokens", "cache_hit_rate")


def pool_file(out: str) -> Path:
    p = Path(out)
    return p if p.name.endswith(".jsonl") else p / "rollout.jsonl"


def completed_groups(path: Path, k: int) -> set[str]:
    """Groups already complete in a pool file left by an earlier run; cuts trailing partial
    groups (and a partial last line) so that only whole groups remain."""
    from srtcli.pool import parse_step, truncate_partial_line

    if not path.exists():
        return set()
    truncate_partial_line(path)
    done: dict[str, set[str]] = {}
    seen: set[tuple[str, str, int]] = set()
    keep, offset, last_uid = 0, 0, None
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            offset += len(raw)
            if not raw.strip():
                continue
            try:
                step = parse_step(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise at(path, lineno, f"cannot resume: {e}") from None
            size = step.meta.get("group_size")
            if size != k:
                raise at(path, lineno, f"cannot resume: written with -n {size}, now -n {k}")
            if (step.prompt_uid, step.trajectory_id, step.step) in seen:
                raise at(path, lineno, f"cannot resume: trajectory {step.trajectory_id!r} step {step.step} "
                                       "appears twice")
            seen.add((step.prompt_uid, step.trajectory_id, step.step))
            if step.prompt_uid != last_uid and last_uid is not None and len(done.get(last_uid, ())) < k:
                raise at(path, lineno, "cannot resume: an incomplete group is followed by another")
            last_uid = step.prompt_uid
            if step.meta.get("last"):
                done.setdefault(step.prompt_uid, set()).add(step.trajectory_id)
            if len(done.get(step.prompt_uid, ())) == k:
                keep = offset
    if keep != path.stat().st_size:
        with open(path, "rb+") as f:
            f.truncate(keep)
    return {uid for uid, t in done.items() if len(t) == k}


def turn_steps(seq: Any, uid: str, reward: float, k: int) -> list:
    """One pool step per model turn of a finished sequence."""
    from srtcli.pool import StepRecord

    turns = [(s, e) for s, e in seq.turns if e > s]
    out = []
    for i, (s, e) in enumerate(turns):
        mask = [0] * s + [1] * (e - s)
        lps = [0.0] * s + seq.logprobs[s:e]
        meta = {"prompt_id": seq.meta["prompt_id"], "sample": seq.meta["sample"],
                "finish_reason": seq.finish_reason if i == len(turns) - 1 else "tool",
                "group_size": k}
        if i == len(turns) - 1:
            meta["last"] = True
        out.append(StepRecord(uid, f"{uid}-{seq.meta['sample']}", i, seq.tokens[:e], mask, lps, reward, meta=meta))
    return out


def tool_hooks(tok: Any, tool: str):
    """(stop_fn, turn_end) for the engine: stop a turn where a tool call closes, then append
    the tool's result as non-trained tokens."""
    from srtcli.rollout.tools import find_tool_call, run_tool

    ends = {i for t, i in tok.get_vocab().items() if ">" in tok.convert_tokens_to_string([t])}

    def stop_fn(seq: Any, emitted: list[int]) -> int | None:
        for i, t in enumerate(emitted):
            if t in ends:
                text = tok.decode(seq.tokens[seq.turn_start:] + emitted[: i + 1], skip_special_tokens=False)
                if find_tool_call(text) is not None:
                    return i + 1
        return None

    def turn_end(seq: Any) -> list[int] | None:
        call = find_tool_call(tok.decode(seq.tokens[seq.turn_start:], skip_special_tokens=False))
        if call is None:
            return None
        return list(tok.encode(run_tool(tool, call), add_special_tokens=False))

    return stop_fn, turn_end


@click.command()
@config_option
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False), help="Prompts JSONL.")
@click.option("--model", default=None, help="A local HF causal LM directory (default: the bundled model).")
@click.option("-n", "--n", "k", type=click.IntRange(min=1), default=8, show_default=True, help="Samples per prompt.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--draft", type=click.Choice(DRAFTERS), default="srt", show_default=True)
@click.option("--budget", type=click.IntRange(min=0), default=8, show_default=True, help="Max draft tokens per step.")
@click.option("--min-prob", type=click.FloatRange(0.0, 1.0), default=0.1, show_default=True,
              help="srt: stop a draft when its path probability falls below this.")
@click.option("--draft-mode", type=click.Choice(["greedy", "sample", "tree"]), default="sample", show_default=True,
              help="srt: follow the most frequent child (point mass), sample children (ratio rule), or "
                   "verify a tree of --budget candidate nodes (embedded engine; docs/rollout.md).")
@click.option("--shared-tree/--no-shared-tree", default=True, show_default=True,
              help="srt: also draft from one run-wide tree over every prompt's outputs "
                   "when it predicts more than the prompt's own tree (docs/rollout.md).")
@click.option("--adaptive-budget/--fixed-budget", default=None,
              help="Adapt each sequence's draft length to what it had accepted (<= --budget) "
                   "[default: adaptive on CPU, where every verified token costs FLOPs; fixed with "
                   "CUDA, where it cuts forwards (docs/rollout.md)].")
@click.option("--cache", "cache_opt", default=None, help="Cache directory (default $SRT_CACHE or ~/.cache/srt).")
@click.option("--out", default="pool", show_default=True, help="Steps pool directory (or a .jsonl file).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Sequences generated together (engine slots; capped at what the prompts need).")
@click.option("--rollout-batch", type=click.IntRange(min=0), default=0, show_default=True,
              help="Prompts per synchronous rollout batch (0 = the whole file).")
@click.option("--run-ahead/--no-run-ahead", default=None,
              help="Long-tail run-ahead [default: on with CUDA; off on CPU, where its extra rows "
                   "slow the real work (docs/benchmarks.md)].")
@click.option("--run-ahead-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--tools", type=click.Choice(["calculator", "none"]), default=None,
              help="Tool to run on tool calls [default: calculator for the bundled model, else none].")
@click.option("--reward", default=None, help="exact_match or MODULE:FN (default: exact_match when "
              "every prompt has an `answer`, else 0).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--threads", type=click.IntRange(min=0), default=1, show_default=True,
              help="CPU threads for torch (0 = torch's default).")
@click.option("--resume", is_flag=True, help="Continue a pool a killed run left behind.")
@click.option("--engine", type=click.Choice(["embedded", "vllm"]), default="embedded", show_default=True,
              help="Generate with srt's own engine, or through vLLM's offline LLM API with SRT drafts "
              "as a vLLM proposer (docs/vllm.md).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="vllm: tensor-parallel ranks.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="vllm: share of accelerator memory (of RAM on CPU) for the KV cache "
              "[default: 0.1 on CPU, 0.9 on GPU].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def rollout(**opts: Any) -> None:
    """Speculative rollout: sample K completions per prompt into a steps pool (lossless)."""
    if opts["engine"] == "embedded":
        resolve_device(opts["device"])  # a missing GPU is one line before anything is written
    try:
        with pool_guard(opts) as guard:  # one writer per pool, and a resume must not change the run
            if guard.note:
                click.echo(guard.note, err=True)
            summary = run_engine(opts)
    except KeyboardInterrupt:
        raise interrupted(pool_file(opts["out"])) from None
    summary = {**summary, **canonical_keys(summary, opts)}
    if opts["as_json"]:
        click.echo(json.dumps(summary))
    else:
        print_summary(summary)


def run_engine(opts: dict) -> dict[str, Any]:
    """The rollout through the chosen engine; returns its summary."""
    if opts["engine"] == "vllm":
        from srtcli.rollout.vllm.engine import run_vllm_rollout

        return run_vllm_rollout(**opts)
    return run_rollout(**opts)


def canonical_keys(summary: dict, o: dict) -> dict[str, Any]:
    """The --json keys every command shares: `out` (what it wrote: here the pool file, also
    `pool`) and `cache` (the tree cache it drafted from; null when it used none)."""
    return {"out": summary["pool"], "cache": str(cache_dir(o["cache_opt"])) if o["draft"] == "srt" else None}


def interrupted(pool: Path) -> Interrupted:
    """Ctrl-C: what the pool keeps and how to go on (the writer has closed it by now)."""
    where = click.get_current_context().command_path
    groups = whole_groups(pool)
    if groups is None:
        return Interrupted(f"{where}: interrupted; nothing was written to {pool}")
    return Interrupted(f"{where}: interrupted; rerun with --resume to continue "
                       f"({pool} keeps {groups} complete group{'s' if groups != 1 else ''})")


def whole_groups(pool: Path) -> int | None:
    """Groups whose every trajectory is in the pool file (None if the file is missing or
    empty); reads only, unlike `completed_groups`, which also cuts what --resume redoes."""
    try:
        raw = pool.read_bytes()
    except OSError:
        return None
    if not raw.strip():
        return None
    done: dict[str, set[str]] = {}
    sizes: dict[str, Any] = {}
    for line in raw.split(b"\n"):
        try:
            d = json.loads(line)
            if d.get("meta", {}).get("last"):
                done.setdefault(d["prompt_uid"], set()).add(d["trajectory_id"])
                sizes[d["prompt_uid"]] = d["meta"].get("group_size")
        except (ValueError, AttributeError, KeyError, TypeError):
            continue  # a partial last line, or a line some other tool left: --resume judges it
    return sum(len(t) == sizes[uid] for uid, t in done.items())


def run_rollout(**o: Any) -> dict[str, Any]:
    """The whole rollout (also the benchmark's entry point); returns the summary."""
    import torch

    from srtcli.models import default_model_dir, load_model_and_tokenizer

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr carry our progress and summary only
    check_prompts_early(o)
    if o["threads"]:
        # small models on a busy CPU: extra intra-op threads spin and cost 100x (measured)
        torch.set_num_threads(o["threads"])
    model_dir = o["model"] or default_model_dir()
    model, tok = load_model_and_tokenizer(model_dir)
    model.to(resolve_device(o["device"]))
    ctx = _context_len(model, tok)
    from srtcli.rollout.prompts import read_prompts

    prompts = read_prompts(o["prompts_path"], tok, ctx - 1)
    return _rollout(o, model, tok, prompts, ctx)


def check_prompts_early(o: dict) -> None:
    """Prompt-file errors that need no model (JSON, the reward's fields), before it loads."""
    from srtcli.rollout.prompts import read_records
    from srtcli.rollout.rewards import reward_for_prompts

    reward_for_prompts(o["reward"] or None, read_records(o["prompts_path"]), o["prompts_path"])


def resolve_device(opt: str) -> str:
    """--device auto|cpu|cuda -> the torch device type to run on."""
    import torch

    if opt == "cuda" and not torch.cuda.is_available():
        built = "no CUDA device is visible" if torch.version.cuda else "this torch is built without CUDA"
        raise SrtError(f"--device cuda: {built} (torch {torch.__version__}); use --device cpu or auto")
    return "cuda" if opt == "cuda" or (opt == "auto" and torch.cuda.is_available()) else "cpu"


# What decides the samples a pool holds; a resumed run must not change them. Speed-only
# options (--draft, --budget, --batch-size, --cache, --device, --engine, ...) may change.
RUN_OPTIONS = ("-n", "--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--tools", "--reward")


def tools_of(o: dict) -> str:
    """--tools, resolved: the bundled model calls the calculator, other models nothing."""
    return o["tools"] or ("none" if o["model"] else "calculator")


def run_definition(o: dict) -> dict[str, Any]:
    """The run record of a rollout (srtcli/run_record.py): models and prompts by content."""
    from srtcli.models import default_model_dir
    from srtcli.run_record import file_entry

    values = {"-n": o["k"], "--max-new-tokens": o["max_new_tokens"], "--temperature": o["temperature"],
              "--top-p": o["top_p"], "--top-k": o["top_k"], "--seed": o["seed"],
              "--tools": tools_of(o), "--reward": o["reward"] or None}
    model = Path(o["model"]) if o["model"] else default_model_dir()
    return {"--model": file_entry(model), "--prompts": file_entry(Path(o["prompts_path"])),
            **{k: values[k] for k in RUN_OPTIONS}}


def pool_guard(o: dict) -> Any:
    """The pool's lock and run record for this run (srtcli/rollout/pool_guard.py)."""
    from srtcli.rollout.pool_guard import PoolGuard

    return PoolGuard(pool_file(o["out"]), run_definition(o), bool(o["resume"]))


def _context_len(model: Any, tok: Any) -> int:
    ctx = getattr(model.config, "max_position_embeddings", None) or 2048
    tmax = getattr(tok, "model_max_length", None)
    if isinstance(tmax, int) and 0 < tmax < ctx:
        ctx = tmax
    return int(ctx)


@dataclass
class Plan:
    """What a rollout run has to do; the same for both engines (embedded and vLLM)."""

    uids: list[str]  # each prompt's cache key, also the pool's prompt_uid
    reward_fn: Callable[[dict, str], float]
    out: Path  # the pool file
    skip: set[str]  # groups a resumed pool already holds whole
    todo: list[int]  # indices of the prompts still to roll out


def plan(o: dict, tok: Any, prompts: list) -> Plan:
    """Cache keys, the reward function, the pool file and, with --resume, what is left to do."""
    from cache_store.uid import prompt_uid
    from srtcli.rollout.rewards import reward_for_prompts
    from srtcli.tokenizers import tokenizer_fingerprint

    fp = tokenizer_fingerprint(tok)
    uids = [prompt_uid(p.ids, fp) for p in prompts]
    reward_fn = reward_for_prompts(o["reward"] or None, [(p.line, p.record) for p in prompts], o["prompts_path"])
    out = pool_file(o["out"])
    skip = completed_groups(out, o["k"]) if o["resume"] else set()
    return Plan(uids, reward_fn, out, skip, [i for i, u in enumerate(uids) if u not in skip])


def _rollout(o: dict, model: Any, tok: Any, prompts: list, ctx: int) -> dict[str, Any]:
    from srtcli.rollout.engine.engine import Engine, Sequence
    from srtcli.rollout.engine.kv_memory import check_kv_fits
    from srtcli.pool import PoolWriter
    from srtcli.rollout.runahead import RunAhead, Upcoming, run_batches
    from srtcli.rollout.engine.sampling import SamplingParams

    k = o["k"]
    if o["draft"] == "srt" and o["draft_mode"] == "tree" and model.config._attn_implementation not in ("sdpa", "eager"):
        raise SrtError(f"--draft-mode tree needs the model's sdpa or eager attention, not "
                       f"{model.config._attn_implementation}")
    pl = plan(o, tok, prompts)
    uids, reward_fn, out, skip, todo = pl.uids, pl.reward_fn, pl.out, pl.skip, pl.todo
    per = o["rollout_batch"] or max(1, len(todo))
    slots = engine_slots(o["batch_size"], per, len(todo), len(prompts), k, _run_ahead_on(o, model))
    max_len = min(ctx, max(len(p.ids) for p in prompts) + o["max_new_tokens"] + 64)
    check_kv_fits(model, slots, max_len)  # before the cache dir is opened
    store = open_cache(o["cache_opt"]) if o["draft"] == "srt" else None
    drafter = _drafter(o, store)
    stop_fn = turn_end = None
    tools = tools_of(o)
    if tools != "none":
        stop_fn, turn_end = tool_hooks(tok, tools)
    params = SamplingParams(o["temperature"], o["top_p"], o["top_k"])
    engine = Engine(model, params, drafter, slots=slots, budget=o["budget"] if o["draft"] != "none" else 0,
                    max_len=max_len, eos_ids=_eos_ids(model, tok), seed=o["seed"], stop_fn=stop_fn,
                    turn_end=turn_end, adaptive=adaptive_on(o, next(model.parameters()).device.type))
    chunks = [todo[i: i + per] for i in range(0, len(todo), per)]
    batches = [[Sequence(prompts[i].ids, o["max_new_tokens"], group=uids[i],
                         meta={"prompt_id": prompts[i].id, "sample": s}) for i in c for s in range(k)] for c in chunks]
    nxt = [chunks[b + 1] if b + 1 < len(chunks) else list(range(len(prompts))) for b in range(len(chunks))]
    upcoming = [[Upcoming(uids[i], prompts[i].ids) for i in n] for n in nxt]
    by_uid = {uids[i]: prompts[i] for i in todo}
    finished: dict[str, list] = {}
    writer = PoolWriter(out, resume=o["resume"], fsync_every=1 << 30)
    progress, task = _progress(len(todo))
    t0, c0 = time.perf_counter(), time.process_time()
    rewards: list[float] = []  # one per trajectory written by this run

    def on_finished(seq: Any) -> None:
        group = finished.setdefault(seq.group, [])
        group.append(seq)
        if len(group) < k:
            return
        rec = by_uid[seq.group]
        for s in sorted(group, key=lambda s: s.meta["sample"]):
            text = tok.decode(s.output, skip_special_tokens=False)
            rewards.append(reward_fn(rec.record, text))
            for step in turn_steps(s, seq.group, rewards[-1], k):
                writer.write(step)
        writer.flush()
        drafter.group_done(seq.group)
        del finished[seq.group]
        if progress is not None:
            progress.advance(task)

    def on_batch_end(b: int) -> None:
        if store is not None:
            drafter.flush()  # this batch's trees reach LMDB before the clock advances
            store.tick()

    try:
        if progress is not None:
            progress.start()
        run_batches(engine, batches, upcoming,
                    RunAhead(_run_ahead_on(o, model), window=max(per, 1), tokens=o["run_ahead_tokens"]),
                    on_finished, on_batch_end)
    finally:
        if progress is not None:
            progress.stop()
        writer.close()
        drafter.close()
        if store is not None:
            store.close()
    cpu = time.process_time() - c0
    return {**_summary(engine, drafter, time.perf_counter() - t0, len(prompts), len(skip), out, o),
            "cpu_s": round(cpu, 3), "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None}


def engine_slots(batch_size: int, per: int, todo: int, n_prompts: int, k: int, run_ahead: bool) -> int:
    """Engine slots: --batch-size, capped at what a rollout batch can use at once: K samples of
    each of its prompts, plus one run-ahead continuation per prompt run ahead for (srtcli/rollout/runahead.py)."""
    work = min(per, todo) * k
    ahead = min(per, n_prompts) if run_ahead else 0
    return max(1, min(batch_size, work + ahead))


def adaptive_on(o: dict, device_type: str) -> bool:
    """--adaptive-budget unless set: on a CPU verified tokens cost FLOPs and adapting paid for
    itself; with CUDA they are nearly free and a fixed budget takes fewer forwards
    (docs/benchmarks.md, Rollout: 121 vs 147 forwards at epoch 3)."""
    if o.get("adaptive_budget") is not None:
        return bool(o["adaptive_budget"])
    return device_type != "cuda"


def _run_ahead_on(o: dict, model: Any) -> bool:
    if o["run_ahead"] is not None:
        return bool(o["run_ahead"])
    return next(model.parameters()).device.type == "cuda"


def _eos_ids(model: Any, tok: Any) -> set[int]:
    """The tokenizer's eos plus any the model's generation config lists."""
    ids = {tok.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, (list, tuple)) else [gen] if gen is not None else [])
    return {int(i) for i in ids if i is not None}


def _drafter(o: dict, store: Any) -> Any:
    from srtcli.rollout.drafters import make_drafter

    if o["draft"] == "srt":
        return make_drafter("srt", store=store, min_prob=o["min_prob"], mode=o["draft_mode"], seed=o["seed"],
                            shared=o.get("shared_tree", True))
    return make_drafter(o["draft"])


def _progress(total: int):
    if not sys.stdout.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import Progress

    progress = Progress(console=Console(stderr=True), transient=True)
    return progress, progress.add_task("rollout (prompts)", total=total)


def _summary(engine: Any, drafter: Any, wall: float, n_prompts: int, skipped: int, out: Path, o: dict) -> dict:
    st = engine.stats
    ds = drafter.stats()
    return {
        "generated_tokens": st.emitted,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(st.emitted / wall, 1) if wall > 0 else 0.0,
        "target_forwards": st.forwards,
        # null, not 0, when nothing was verified (every group was already in a resumed pool)
        "accepted_per_forward": round(st.emitted / st.row_forwards, 4) if st.row_forwards else None,
        "draft_acceptance_rate": round(st.accepted / st.drafted, 4) if st.drafted else 0.0,
        "run_ahead_tokens": st.runahead_tokens,
        "cache_hit_rate": round(ds["cache_hit_rate"], 4) if "cache_hit_rate" in ds else None,
        "model_s": round(st.model_s, 3),
        "drafted_tokens": st.drafted,
        "accepted_draft_tokens": st.accepted,
        "prompts": n_prompts,
        "groups_skipped": skipped,
        "samples_per_prompt": o["k"],
        "draft": o["draft"],
        "pool": str(out),
    }


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="srt rollout")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, val in summary.items():
        if isinstance(val, float) and not math.isfinite(val):
            val = "n/a"
        table.add_row(key, "n/a" if val is None else str(val))
    Console().print(table)
