"""Will the engine's KV cache fit? An estimate checked before the cache is allocated.

The engine's `SlotKVCache` holds, per layer, keys and values of shape
[slots, kv_heads, max_len + 1, head_dim] in the dtype of the model's keys; heads, head size and
dtype per layer are read off a one-token forward of the model itself. Allocating more than the
machine has does not fail cleanly: on a CPU the kernel's OOM killer ends the process (and an
empty pool is all that is left), on CUDA the error comes from deep inside a forward. So the
engine compares this estimate with the memory available (Linux `MemAvailable`, lowered to the
cgroup's limit when there is one; on CUDA the free memory plus what torch's allocator holds
unused) and refuses with one line before anything is allocated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from srtcli.errors import SrtError
from srtcli.models import returned_cache

_LAYERS = "_srt_kv_layers"  # a model attribute: its layers' (kv_heads, head_dim, dtype)


@torch.inference_mode()
def _probe(model: Any) -> list[tuple[int, int, torch.dtype]] | None:
    """(kv_heads, head_dim, dtype) of each layer's keys as the model itself stores them, read
    off a one-token forward (configs can disagree with the modules; per-layer shapes may vary)."""
    dev = next(model.parameters()).device
    one = torch.ones(1, 1, dtype=torch.long, device=dev)
    cache = returned_cache(model(input_ids=one, attention_mask=one, use_cache=True))
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(lay, "keys", None) is None for lay in layers):
        return None
    return [(lay.keys.shape[1], lay.keys.shape[3], lay.keys.dtype) for lay in layers]


def _from_config(model: Any) -> list[tuple[int, int, torch.dtype]] | None:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    try:
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return [(kv, dim, next(model.parameters()).dtype)] * int(cfg.num_hidden_layers)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None


def kv_cache_bytes(model: Any, slots: int, max_len: int) -> int | None:
    """Bytes of the engine's cache for `model`: per layer, keys and values of
    [slots, kv_heads, max_len + 1, head_dim]; None if the model does not tell."""
    layers = getattr(model, _LAYERS, None)
    if layers is None:  # probed once per model: the rollout checks before and in the engine
        layers = _probe(model) or _from_config(model)
        setattr(model, _LAYERS, layers)
    if layers is None:
        return None
    return sum(2 * slots * kv * (max_len + 1) * dim * dtype.itemsize for kv, dim, dtype in layers)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cpu_available() -> int | None:
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if avail is not None and limit is not None and used is not None:
        avail = min(avail, max(0, limit - used))
    return avail


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation on `device` can use, or None where we cannot tell."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        return _cpu_available()
    return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def check_kv_fits(model: Any, slots: int, max_len: int, available: int | None = None) -> None:
    """Raise a one-line SrtError if the engine's KV cache for `slots` x `max_len` cannot fit
    in the memory of the model's device. `available` overrides the measured free memory (tests)."""
    need = kv_cache_bytes(model, slots, max_len)
    device = next(model.parameters()).device
    have = available_bytes(device) if available is None else available
    if need is not None and have is not None and need > have:
        raise SrtError(
            f"the KV cache for {slots} sequences of up to {max_len} tokens needs {_gb(need)}, "
            f"more than the {_gb(have)} available on {device.type}; lower --batch-size or --max-new-tokens"
        )
