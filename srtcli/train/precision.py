"""Mixed precision for `srt train`: bf16 compute over float32 weights, where the device does bf16 well.

`--mixed-precision auto` (the default) runs each micro-batch's forwards, the policy's and the
reference's, under `torch.autocast(dtype=torch.bfloat16)` on a CUDA device that supports bf16,
and in float32 everywhere else: a CPU without AMX computes bf16 more slowly than float32.
`bf16` asks for it on any device, `no` never. The weights, their gradients and AdamW's moments
stay in `--dtype` (float32 by default), so small updates are kept: at lr 1e-6 a weight of 0.01
moves by 1e-4 of itself, below bf16's resolution (2^-8), which `--dtype bfloat16` would round
away. Log-probs come from log_softmax, which autocast runs in float32; gradient checkpointing
recomputes a layer under the autocast state its forward had. The backward runs outside autocast,
as PyTorch recommends.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

MODES = ("auto", "bf16", "no")


def autocast_dtype(mode: str, device: str) -> torch.dtype | None:
    """The dtype a step computes in under `mode` on `device` ("cpu", "cuda", "cuda:1"); None:
    the weights' own dtype, no autocast."""
    if mode not in MODES:
        raise ValueError(f"unknown --mixed-precision {mode!r} (one of {', '.join(MODES)})")
    if mode == "bf16" or (mode == "auto" and device.startswith("cuda") and torch.cuda.is_available()
                          and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return None


def autocast(dtype: torch.dtype | None, device: str) -> AbstractContextManager:
    """The forward's autocast context for `dtype` (a no-op for None)."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
