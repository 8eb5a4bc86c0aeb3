"""What a `srt train` run trains with: policy, reference, optimizer, scheduler, start step.

`build` checks everything a run needs (the model directories, `--fsdp`, a `--resume`
checkpoint against the run's record) and fits the models to the data before anything is
written; resuming restores the checkpoint's weights, optimizer, scheduler and RNG states. The
policy runs with dropout off (`eval()`): PPO ratios compare against the sampling policy, which
had no dropout either. Gradients still flow; eval only changes dropout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from srtcli.errors import SrtError
from srtcli.models import check_model_dir, load_model
from srtcli.train import dist
from srtcli.train.checkpoint import latest_checkpoint, load_state, optimizer_state_by_index, set_rng_state
from srtcli.train.config import DTYPES, TrainConfig, model_dir, resolve_attn
from srtcli.train.data import TrainData, check_fits
from srtcli.train.precision import autocast_dtype
from srtcli.train.resume import check_resume, run_definition

# plain rows' HF attention (packed rows pick their own): None is transformers' default, sdpa where
# the model class supports it, else eager (Gemma2 refuses sdpa from transformers 5.2x: softcapping)
HF_ATTN = {"sdpa": None, "eager": "eager", "flex": None}


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
    compute_dtype: torch.dtype | None  # the forwards' autocast dtype (srtcli.train.precision); None: none
    notes: list[str]
    run: dict[str, Any]  # the run record every checkpoint keeps (srtcli.train.resume)


def build(cfg: TrainConfig, info: dist.DistInfo, total: int, data: TrainData) -> Built:
    """Model, reference, optimizer, scheduler, and the step to start from; all checks first."""
    source = model_dir(cfg)
    check_model_dir(source, tokenizer=False)
    attn = resolve_attn(cfg.attn, info.device)
    if cfg.fsdp and not info.active:
        raise SrtError("--fsdp shards over several processes: use --nproc N (N >= 2) or torchrun")
    run = run_definition(cfg, source, total)
    ckpt = latest_checkpoint(Path(cfg.out)) if cfg.resume else None
    state = load_state(ckpt) if ckpt is not None else None
    notes = check_resume(ckpt, state.get("extra") or {}, run, total) if state is not None else []
    model, ref = _models(cfg, info, source, ckpt, attn, data)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg.lr_schedule, cfg.warmup_steps, total))
    start = 0
    if state is not None:
        _restore(cfg, model, opt, sched, state)
        start = int(state["step"])
    compute = autocast_dtype(cfg.mixed_precision, info.device)
    return Built(source, model, ref, opt, sched, start, ckpt, attn, compute, notes, run)


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


def train_model(path: Path, dtype: torch.dtype, attn: str, device: str) -> torch.nn.Module:
    """The causal LM in `path` on `device`, with the HF attention its plain rows use; no
    tokenizer needed. transformers' own progress bars and warnings stay off the console."""
    check_model_dir(path, tokenizer=False)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    hf_attn = HF_ATTN.get(attn)
    return load_model(path, dtype, **({"attn_implementation": hf_attn} if hf_attn else {})).to(device)


def _models(cfg: TrainConfig, info: dist.DistInfo, source: Path, ckpt: Path | None, attn: str,
            data: TrainData) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy (from the checkpoint when resuming) and the reference, each checked to fit
    the data before anything is written."""
    dtype, where = DTYPES[cfg.dtype], Path(cfg.steps or cfg.shards)
    model = train_model(ckpt or source, dtype, attn, info.device)
    model.eval()  # dropout off; see the module docstring
    if cfg.gradient_checkpointing:
        _checkpoint(model, ckpt or source)
    check_fits(data, model, ckpt or source, where)
    ref = None
    if cfg.kl_coef:
        ref_dir = Path(cfg.ref_model) if cfg.ref_model else source
        ref = train_model(ref_dir, dtype, attn, info.device)
        ref.eval().requires_grad_(False)
        check_fits(data, ref, ref_dir, where)
    if cfg.fsdp:
        from srtcli.train.fsdp import shard

        model = shard(model)
        ref = shard(ref) if ref is not None else None
    return model, ref


def _checkpoint(model: torch.nn.Module, path: Path) -> None:
    from attention.checkpointing import checkpoint_layers

    try:
        checkpoint_layers(model)
    except ValueError as e:
        raise SrtError(f"{path}: --gradient-checkpointing: {e}") from None


def _restore(cfg: TrainConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, state: dict) -> None:
    """Optimizer, scheduler and RNG states of a checkpoint."""
    if cfg.fsdp:
        from srtcli.train.fsdp import load_optimizer

        load_optimizer(model, opt, state["optimizer"])
    else:
        opt.load_state_dict(optimizer_state_by_index(model, state["optimizer"]))
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])

