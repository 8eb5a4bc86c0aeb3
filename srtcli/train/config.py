"""What `srt train` takes (`TrainConfig`) and the checks of it that need neither data nor model.

Every check here raises a one-line `SrtError` before anything is written; `srtcli.train.loop`
runs them in each process, and `precheck` there runs them once before `--nproc` launches
torchrun (whose ranks would each report the same error, with a traceback).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from srtcli.errors import SrtError
from srtcli.models import default_model_dir
from srtcli.train.checkpoint import has_run
from srtcli.train.loss import LossConfig
from srtcli.train.precision import MODES as MIXED_PRECISION

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
    gradient_checkpointing: bool = False
    mixed_precision: str = "auto"  # srtcli.train.precision: bf16 autocast where the device does bf16 well
    temperature: float | None = None  # None: the temperature the steps were sampled at


def check_config(cfg: TrainConfig) -> None:
    """One data source; numbers the optimizer or the loss would refuse with a traceback; the
    loss aggregation and the dtype."""
    if (cfg.steps is None) == (cfg.shards is None):
        raise SrtError("give exactly one of --shards DIR or --steps POOL")
    for name in ("lr", "weight_decay", "clip", "kl_coef", "grad_clip"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise SrtError(f"--{name.replace('_', '-')} must be a finite number >= 0, not {value}")
    LossConfig(cfg.clip, cfg.kl_coef, cfg.loss_agg)  # validates the aggregation
    if cfg.dtype not in DTYPES:
        raise SrtError(f"unknown --dtype {cfg.dtype!r}")
    if cfg.mixed_precision not in MIXED_PRECISION:
        raise SrtError(f"unknown --mixed-precision {cfg.mixed_precision!r}")


def check_out(cfg: TrainConfig) -> None:
    """`--out` is a directory (or nothing yet) and holds no run unless `--resume`."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise SrtError(f"{out}: --out must be a directory")
    if has_run(out) and not cfg.resume:
        raise SrtError(f"{out}: already holds a training run (pass --resume to continue it, or another --out)")


def resolve_attn(attn: str, device: str) -> str:
    """`auto`: compiled FlexAttention on CUDA, the SDPA boolean mask on CPU."""
    if attn == "auto":
        return "flex" if device.startswith("cuda") else "sdpa"
    if attn == "flex" and not device.startswith("cuda"):
        # torch 2.13: FlexAttention has no backward on CPU, compiled or not
        raise SrtError("--attn flex trains on CUDA only (FlexAttention has no backward on CPU); use sdpa or eager")
    return attn


def model_dir(cfg: TrainConfig) -> Path:
    """The policy's source directory: `--model`, or the bundled model."""
    return Path(cfg.model) if cfg.model is not None else default_model_dir()
