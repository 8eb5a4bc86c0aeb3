"""The `srt train` loop: PPO-clip over packed shards or a raw steps pool, one process or many.

`train` checks the options and the data, builds the models and optimizer
(`srtcli.train.build`), then runs one `step_gradients` (`srtcli.train.step`) per optimizer
step, reporting each step (`srtcli.train.metrics`) and checkpointing (`srtcli.train.checkpoint`)
every `--save-every` steps and at the end; the final model is published at the root of `--out`.
Nothing is written before every check has passed. `precheck` is the same checks, run once
before `--nproc` launches the ranks.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srtcli.models import check_model_dir
from srtcli.train import dist
from srtcli.train.build import Built, build
from srtcli.train.checkpoint import publish_final, remove_partial, save_checkpoint, step_dir
from srtcli.train.config import TrainConfig, check_config, check_out, model_dir, resolve_attn
from srtcli.train.data import TrainData, WorkRow, load_packed, load_steps, plan_batches, training_temperature
from srtcli.train.loss import LossConfig
from srtcli.train.metrics import METRICS, Reporter, trim_metrics
from srtcli.train.step import step_gradients, step_record


def load_data(cfg: TrainConfig) -> TrainData:
    """The work rows of `--steps` (plain) or `--shards` (packed)."""
    if cfg.steps is not None:
        return load_steps(Path(cfg.steps), cfg.skip_bad)
    return load_packed(Path(cfg.shards))


def precheck(cfg: TrainConfig) -> None:
    """Every user error `train` would find before loading a model, and the model directory:
    once, in this process, before `--nproc` launches ranks that would each report it."""
    check_config(cfg)
    training_temperature(load_data(cfg), cfg.temperature, Path(cfg.steps or cfg.shards))
    resolve_attn(cfg.attn, "cuda" if torch.cuda.is_available() else "cpu")
    check_out(cfg)
    check_model_dir(model_dir(cfg), tokenizer=False)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(cfg: TrainConfig, info: dist.DistInfo | None = None, json_mode: bool = False) -> dict[str, Any]:
    """Run `srt train`; returns the summary (the `--json` object)."""
    info = info or dist.init()
    check_config(cfg)
    seed_all(cfg.seed)
    data = load_data(cfg)
    batches = plan_batches(data.rows, cfg.batch_size)
    total = len(batches) * cfg.epochs
    if cfg.max_steps > 0:
        total = min(total, cfg.max_steps)
    resolve_attn(cfg.attn, info.device)  # a bad choice fails before anything is written
    check_out(cfg)
    dist.barrier(info)  # every rank checked --out before rank 0 writes to it
    built = build(cfg, info, total, data)  # everything checked: the first write follows
    if info.main:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        trim_metrics(Path(cfg.out) / METRICS, built.start)
        remove_partial(Path(cfg.out))
    reporter = Reporter(Path(cfg.out), info.main, json_mode, total, built.start)
    try:
        return _loop(cfg, info, data, batches, total, built, reporter)
    finally:
        reporter.close()


def _loop(cfg: TrainConfig, info: dist.DistInfo, data: TrainData, batches: list[list[WorkRow]], total: int,
          built: Built, reporter: Reporter) -> dict[str, Any]:
    start, ckpt = built.start, built.ckpt
    for note in built.notes:
        reporter.info(note)
    if start >= total:
        return _nothing_to_do(cfg, info, data, total, built, reporter)
    temperature = training_temperature(data, cfg.temperature, Path(cfg.steps or cfg.shards))
    loss_cfg = LossConfig(cfg.clip, cfg.kl_coef, cfg.loss_agg, temperature)
    scored = f"log-probs at temperature {temperature:g}, " if temperature != 1.0 else ""
    reporter.info(
        f"srt train: {data.source} ({data.n_seqs} sequences in {len(data.rows)} rows), {scored}"
        f"{len(batches)} optimizer steps per epoch, {total} in all; attention: {built.attn}"
        f"{', bf16 autocast' if built.compute_dtype is not None else ''}; "
        f"world {info.world} on {info.device}" + (f"; resuming at step {start} from {ckpt}" if ckpt else "")
    )
    first: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    t0 = time.perf_counter()
    last_saved = start if ckpt is not None else -1
    for step in range(start, total):
        rec = _optimizer_step(cfg, info, batches, step, loss_cfg, built)
        reporter.step(rec)
        first = first or rec
        last = rec
        if cfg.save_every > 0 and (step + 1) % cfg.save_every == 0 and step + 1 < total:
            _save(cfg, info, step + 1, built)
            last_saved = step + 1
    if last_saved != total:
        _save(cfg, info, total, built)
    if info.main:
        publish_final(Path(cfg.out), step_dir(Path(cfg.out), total))
    dist.barrier(info)
    return _summary(cfg, info, data, built, first, last, total, total - start, time.perf_counter() - t0)


def _optimizer_step(cfg: TrainConfig, info: dist.DistInfo, batches: list[list[WorkRow]], step: int,
                    loss_cfg: LossConfig, built: Built) -> dict[str, Any]:
    """Optimizer step `step` (0-based): gradient, clipping, update; its metrics record."""
    model, opt, sched = built.model, built.opt, built.sched
    params = [p for p in model.parameters() if p.requires_grad]
    ts = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    batch = batches[step % len(batches)]
    res = step_gradients(model, built.ref, batch, loss_cfg, cfg.micro_batch_tokens, info, built.attn, cfg.fsdp,
                         built.compute_dtype)
    limit = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
    lr = sched.get_last_lr()[0]
    opt.step()
    sched.step()
    return step_record(step + 1, step // len(batches), lr, res, grad_norm, time.perf_counter() - ts)


def _save(cfg: TrainConfig, info: dist.DistInfo, step: int, built: Built) -> Path | None:
    path = None
    states: tuple[dict | None, dict | None] = (None, None)
    if cfg.fsdp:  # every rank takes part in gathering the full state
        from srtcli.train.fsdp import full_states

        states = full_states(built.model, built.opt)
    if info.main:
        extra = {"config": _jsonable(cfg), "run": built.run}
        path = save_checkpoint(Path(cfg.out), step, built.model, built.opt, built.sched, built.model_dir, extra,
                               *states)
    dist.barrier(info)
    return path


def _jsonable(cfg: TrainConfig) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}


def _nothing_to_do(cfg: TrainConfig, info: dist.DistInfo, data: TrainData, total: int, built: Built,
                   reporter: Reporter) -> dict[str, Any]:
    """A resumed run whose checkpoint is already at (or past) the end of this run's plan."""
    start = built.start
    plan = f"{total} step{'' if total == 1 else 's'}"
    reporter.info(f"nothing to do: {cfg.out} already holds step {start}, the end of this run's plan ({plan})"
                  if start == total else
                  f"nothing to do: {cfg.out} already holds step {start}, past the end of this run's plan "
                  f"({plan}); raise --epochs or --max-steps to train further")
    if info.main:
        publish_final(Path(cfg.out), built.ckpt)  # the model at the root is that checkpoint's
    dist.barrier(info)
    return _summary(cfg, info, data, built, None, None, start, 0, 0.0)


def _summary(cfg: TrainConfig, info: dist.DistInfo, data: TrainData, built: Built, first: dict | None,
             last: dict | None, steps: int, steps_run: int, wall: float) -> dict[str, Any]:
    summary = {
        "loss": first["loss"] if first else None,
        "grad_norm": first["grad_norm"] if first else None,
        "last_loss": last["loss"] if last else None,
        "steps": steps,
        "steps_run": steps_run,
        "wall_s": wall,
        "tokens": sum(r.tokens for r in data.rows),
        "packed_tokens": sum(r.packed_tokens for r in data.rows),
        "attn": built.attn,
        "mixed_precision": "no" if built.compute_dtype is None else "bf16",
        "world": info.world,
        "fsdp": cfg.fsdp,
        "out": str(cfg.out),
    }
    summary["token_ratio"] = summary["packed_tokens"] / max(summary["tokens"], 1)
    return summary
