"""The `srt train` loop: PPO-clip over packed shards or a raw steps pool, one process or many.

How the pieces fit:

    train_data     rows (packed or plain) -> optimizer-step batches -> ranks -> micro-batches
    train_forward  a micro-batch -> per-sequence log-probs [n, W] (plain causal or tree-packed)
    loss           PPO-clip + k3 KL, aggregated with *global* normalisers
    dist           all-reduce of normalisers, gradients (SUM) and metrics
    train_ckpt     HF checkpoints + optimizer/scheduler/step/RNG for --resume
    train_metrics  metrics.jsonl and the console

`step_gradients` is the heart: after it returns, every parameter's `.grad` holds the gradient
of the global batch loss, identical (up to float rounding) whether the batch ran packed or
plain, in one micro-batch or many, on one rank or several. The tests check exactly that.

The policy runs with dropout off (`model.eval()`): PPO ratios compare against the sampling
policy, which had no dropout either. Gradients still flow; eval only changes dropout.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srtcli.train import dist
from srtcli.errors import SrtError
from srtcli.train.loss import LossConfig, LossStats, Normalizers, batch_loss, count_normalizers
from srtcli.train.checkpoint import (
    has_run, latest_checkpoint, load_state, optimizer_state_by_index, publish_final, remove_partial,
    save_checkpoint, set_rng_state, step_dir,
)
from srtcli.train.data import (
    TrainData, WorkRow, check_fits, load_packed, load_steps, micro_batches, plan_batches, split_ranks,
)
from srtcli.train.logprobs import micro_tensors
from srtcli.train.metrics import METRICS, Reporter, trim_metrics
from srtcli.train.model import check_model_dir, load_model, resolve_model_dir
from srtcli.train.resume import check_resume, run_definition

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrainConfig:
    """Everything `srt train` takes; field names are the long flag names."""

    out: Path
    steps: Path | None = None
    shards: Path | None = None
    model: Path | None = None
    ref_model: Path | None = None
    lr: float = 1e-6
    epochs: int = 1
    batch_size: int = 0  # sequences per optimizer step; 0 = all
    micro_batch_tokens: int = 8192
    clip: float = 0.2
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"
    max_steps: int = 0  # 0 = no cap
    seed: int = 0
    attn: str = "auto"
    resume: bool = False
    save_every: int = 0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    grad_clip: float = 1.0  # 0 = no clipping (the norm is still measured)
    weight_decay: float = 0.0
    dtype: str = "float32"
    skip_bad: bool = False
    fsdp: bool = False


@dataclass
class StepResult:
    """Global figures of one optimizer step's batch (summed over micro-batches and ranks)."""

    stats: LossStats
    norm: Normalizers
    tokens: int
    packed_tokens: int
    seqs: int


def resolve_attn(attn: str, device: str) -> str:
    """`auto`: compiled FlexAttention on CUDA, the SDPA boolean mask on CPU."""
    if attn == "auto":
        return "flex" if device.startswith("cuda") else "sdpa"
    if attn == "flex" and not device.startswith("cuda"):
        # torch 2.13: FlexAttention has no backward on CPU, compiled or not
        raise SrtError("--attn flex trains on CUDA only (FlexAttention has no backward on CPU); use sdpa or eager")
    return attn


def step_gradients(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    batch: list[WorkRow],
    loss_cfg: LossConfig,
    micro_tokens: int,
    info: dist.DistInfo,
    attn: str = "sdpa",
    fsdp: bool = False,
) -> StepResult:
    """Accumulate the global batch's gradient into `.grad` (summed over ranks)."""
    mine = split_ranks(batch, info.world)[info.rank]
    local = count_normalizers([s.loss_mask for r in mine for s in r.seqs])
    # the normalisers must be global: a rank dividing by its own counts would weight its
    # tokens differently from the single-process run
    tokens, seqs = dist.all_reduce_sum(info, [local.tokens, local.seqs])
    norm = Normalizers(tokens, seqs)
    stats = LossStats()
    mbs = micro_batches(mine, micro_tokens)
    n = len(mbs)
    if fsdp:  # same number of forwards on every rank; see srtcli/train/fsdp.py
        from srtcli.train.fsdp import RootForward, set_sync

        n = int(dist.all_reduce_max(info, n))
        spare = [min(batch, key=lambda r: r.cost)]
        fwd, ref_fwd = RootForward(model), (RootForward(ref_model) if ref_model is not None else None)
    else:
        fwd, ref_fwd = model, ref_model
    for i in range(n):
        real = i < len(mbs)
        if fsdp:
            set_sync(model, i == n - 1)
        t, ref_lp = micro_tensors(fwd, ref_fwd, mbs[i] if real else spare, info.device, attn)
        share, st = batch_loss(t.lp, t.old, t.adv, t.mask, ref_lp, loss_cfg, norm)
        scale = (info.world if fsdp else 1) * (1.0 if real else 0.0)
        (share * scale if scale != 1 else share).backward()
        if real:
            stats.add(st)
    if not fsdp:
        dist.sum_gradients(info, [p for p in model.parameters() if p.requires_grad])
    counts = [sum(r.tokens for r in mine), sum(r.packed_tokens for r in mine), sum(len(r.seqs) for r in mine)]
    total = dist.all_reduce_sum(info, stats.as_list() + counts)
    return StepResult(LossStats.from_list(total[:5]), norm, int(total[5]), int(total[6]), int(total[7]))


def lr_factor(schedule: str, warmup: int, total: int):
    """LambdaLR factor: linear warmup over `warmup` steps, then constant or cosine to 0."""

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        span = max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / span)))

    return f


def load_data(cfg: TrainConfig) -> TrainData:
    if (cfg.steps is None) == (cfg.shards is None):
        raise SrtError("give exactly one of --shards DIR or --steps POOL")
    if cfg.steps is not None:
        return load_steps(Path(cfg.steps), cfg.skip_bad)
    return load_packed(Path(cfg.shards))


def check_numbers(cfg: TrainConfig) -> None:
    """Numeric options that the optimizer or the loss would refuse with a traceback."""
    for name in ("lr", "weight_decay", "clip", "kl_coef", "grad_clip"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise SrtError(f"--{name.replace('_', '-')} must be a finite number >= 0, not {value}")


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _check_out(cfg: TrainConfig) -> None:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise SrtError(f"{out}: --out must be a directory")
    if has_run(out) and not cfg.resume:
        raise SrtError(f"{out}: already holds a training run (pass --resume to continue it, or another --out)")


@dataclass
class Built:
    """What a run trains with: models, optimizer, scheduler, and where it starts."""

    model_dir: Path
    model: torch.nn.Module
    ref: torch.nn.Module | None
    opt: torch.optim.Optimizer
    sched: Any
    start: int
    ckpt: Path | None
    attn: str
    notes: list[str]
    run: dict[str, Any]  # the run record every checkpoint keeps (srtcli/train/resume.py)


def _build(cfg: TrainConfig, info: dist.DistInfo, total: int, data: TrainData) -> Built:
    """Model, reference, optimizer, scheduler, and the step to start from; all checks first."""
    model_dir = resolve_model_dir(cfg.model)
    check_model_dir(model_dir)
    attn = resolve_attn(cfg.attn, info.device)
    if cfg.fsdp and not info.active:
        raise SrtError("--fsdp shards over several processes: use --nproc N (N >= 2) or torchrun")
    run = run_definition(cfg, model_dir, total)
    ckpt = latest_checkpoint(Path(cfg.out)) if cfg.resume else None
    state = load_state(ckpt) if ckpt is not None else None
    notes = check_resume(ckpt, state.get("extra") or {}, run, total) if state is not None else []
    model, ref = _models(cfg, info, model_dir, ckpt, attn, data)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg.lr_schedule, cfg.warmup_steps, total))
    start = 0
    if state is not None:
        _restore(cfg, model, opt, sched, state)
        start = int(state["step"])
    return Built(model_dir, model, ref, opt, sched, start, ckpt, attn, notes, run)


def _models(cfg: TrainConfig, info: dist.DistInfo, model_dir: Path, ckpt: Path | None, attn: str,
            data: TrainData) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy (from the checkpoint when resuming) and the reference, each checked to fit
    the data before anything is written."""
    dtype, where = DTYPES[cfg.dtype], Path(cfg.steps or cfg.shards)
    model = load_model(ckpt or model_dir, dtype, attn, info.device)
    model.eval()  # dropout off; see the module docstring
    check_fits(data, model, ckpt or model_dir, where)
    ref = None
    if cfg.kl_coef:
        ref_dir = Path(cfg.ref_model) if cfg.ref_model else model_dir
        ref = load_model(ref_dir, dtype, attn, info.device)
        ref.eval().requires_grad_(False)
        check_fits(data, ref, ref_dir, where)
    if cfg.fsdp:
        from srtcli.train.fsdp import shard

        model = shard(model)
        ref = shard(ref) if ref is not None else None
    return model, ref


def _restore(cfg: TrainConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, state: dict) -> None:
    """Optimizer, scheduler and RNG states of a checkpoint."""
    if cfg.fsdp:
        from srtcli.train.fsdp import load_optimizer

        load_optimizer(model, opt, state["optimizer"])
    else:
        opt.load_state_dict(optimizer_state_by_index(model, state["optimizer"]))
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])


def _record(step: int, epoch: int, lr: float, res: StepResult, grad_norm: float, secs: float) -> dict[str, Any]:
    toks = max(res.stats.tokens, 1.0)
    return {
        "step": step,
        "epoch": epoch,
        "lr": lr,
        "loss": res.stats.loss,
        "clip_frac": res.stats.clipped / toks,
        "kl": res.stats.kl / toks,
        "ratio_mean": res.stats.ratio / toks,
        "grad_norm": grad_norm,
        "trained_tokens": int(res.stats.tokens),
        "seqs": res.seqs,
        "tokens": res.tokens,
        "packed_tokens": res.packed_tokens,
        "token_ratio": res.packed_tokens / max(res.tokens, 1),
        "step_s": secs,
        "tokens_per_s": res.tokens / max(secs, 1e-9),
    }


def _save(cfg: TrainConfig, info: dist.DistInfo, step: int, model, opt, sched, built: Built) -> Path | None:
    path = None
    states: tuple[dict | None, dict | None] = (None, None)
    if cfg.fsdp:  # every rank takes part in gathering the full state
        from srtcli.train.fsdp import full_states

        states = full_states(model, opt)
    if info.main:
        extra = {"config": _jsonable(cfg), "run": built.run}
        path = save_checkpoint(Path(cfg.out), step, model, opt, sched, built.model_dir, extra, *states)
    dist.barrier(info)
    return path


def _jsonable(cfg: TrainConfig) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}


def train(cfg: TrainConfig, info: dist.DistInfo | None = None, json_mode: bool = False) -> dict[str, Any]:
    """Run `srt train`; returns the summary (the `--json` object)."""
    info = info or dist.init()
    check_numbers(cfg)
    LossConfig(cfg.clip, cfg.kl_coef, cfg.loss_agg)  # validates the aggregation early
    if cfg.dtype not in DTYPES:
        raise SrtError(f"unknown --dtype {cfg.dtype!r}")
    seed_all(cfg.seed)
    data = load_data(cfg)
    batches = plan_batches(data.rows, cfg.batch_size)
    total = len(batches) * cfg.epochs
    if cfg.max_steps > 0:
        total = min(total, cfg.max_steps)
    resolve_attn(cfg.attn, info.device)  # a bad choice fails before anything is written
    _check_out(cfg)
    dist.barrier(info)  # every rank checked --out before rank 0 writes to it
    built = _build(cfg, info, total, data)  # everything checked: the first write follows
    if info.main:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        trim_metrics(Path(cfg.out) / METRICS, built.start)
        remove_partial(Path(cfg.out))
    reporter = Reporter(Path(cfg.out), info.main, json_mode, total, built.start)
    try:
        return _loop(cfg, info, data, batches, total, built, reporter)
    finally:
        reporter.close()


def _loop(cfg, info, data, batches, total, built: Built, reporter) -> dict[str, Any]:
    model, ref, opt, sched = built.model, built.ref, built.opt, built.sched
    start, ckpt, attn = built.start, built.ckpt, built.attn
    for note in built.notes:
        reporter.info(note)
    if start >= total:
        return _nothing_to_do(cfg, info, data, total, built, reporter)
    loss_cfg = LossConfig(cfg.clip, cfg.kl_coef, cfg.loss_agg)
    params = [p for p in model.parameters() if p.requires_grad]
    reporter.info(
        f"srt train: {data.source} ({data.n_seqs} sequences in {len(data.rows)} rows), "
        f"{len(batches)} optimizer steps per epoch, {total} in all; attention: {attn}; "
        f"world {info.world} on {info.device}" + (f"; resuming at step {start} from {ckpt}" if ckpt else "")
    )
    first: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    t0 = time.perf_counter()
    last_saved = start if ckpt is not None else -1
    for step in range(start, total):
        ts = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        batch = batches[step % len(batches)]
        res = step_gradients(model, ref, batch, loss_cfg, cfg.micro_batch_tokens, info, attn, cfg.fsdp)
        limit = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        rec = _record(step + 1, step // len(batches), lr, res, grad_norm, time.perf_counter() - ts)
        reporter.step(rec)
        first = first or rec
        last = rec
        if cfg.save_every > 0 and (step + 1) % cfg.save_every == 0 and step + 1 < total:
            _save(cfg, info, step + 1, model, opt, sched, built)
            last_saved = step + 1
    if last_saved != total:
        _save(cfg, info, total, model, opt, sched, built)
    if info.main:
        publish_final(Path(cfg.out), step_dir(Path(cfg.out), total))
    dist.barrier(info)
    return _summary(cfg, info, data, attn, first, last, total, total - start, time.perf_counter() - t0)


def _nothing_to_do(cfg, info, data, total: int, built: Built, reporter) -> dict[str, Any]:
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
    return _summary(cfg, info, data, built.attn, None, None, start, 0, 0.0)


def _summary(cfg, info, data, attn: str, first, last, steps: int, steps_run: int, wall: float) -> dict[str, Any]:
    summary = {
        "loss": first["loss"] if first else None,
        "grad_norm": first["grad_norm"] if first else None,
        "last_loss": last["loss"] if last else None,
        "steps": steps,
        "steps_run": steps_run,
        "wall_s": wall,
        "tokens": sum(r.tokens for r in data.rows),
        "packed_tokens": sum(r.packed_tokens for r in data.rows),
        "attn": attn,
        "world": info.world,
        "fsdp": cfg.fsdp,
        "out": str(cfg.out),
    }
    summary["token_ratio"] = summary["packed_tokens"] / max(summary["tokens"], 1)
    return summary
