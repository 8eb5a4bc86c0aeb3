"""Where models come from: the bundled model, the one rule for a model directory, and loading.

srt ships a small Llama trained from scratch on the arith workload (examples/arith/), in
standard Hugging Face format under `srtcli/bundled_model/`, so `srt rollout` and `srt train` work
right after install with no download; `default_model_dir()` is it, for any `--model` not given.

Every command checks a model directory with `check_model_dir` before loading it, so `rollout`
and `train` accept the same directories: a `config.json` that is a model config (valid JSON with
a `model_type`), weights under a name transformers loads (`WEIGHT_FILES`), and, where a
tokenizer is loaded (`rollout`, not `train`), `tokenizer.json` and `tokenizer_config.json`.
Anything else is a one-line `SrtError` naming the directory (or file and line), never a
traceback from transformers. Loading is always offline (local files only), and a loaded model
passes `srtcli.attention_support.check_attention` (its attention is one srt computes exactly)
before any command uses it.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError, first_line
from srtcli.tokenizers import TOKENIZER_FILES, check_dir

BUNDLED = Path(__file__).resolve().parent / "bundled_model"
CONFIG = "config.json"
TOKENIZER_REQUIRED = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def default_model_dir() -> Path:
    """The bundled model's directory (inside the installed package)."""
    if not (BUNDLED / CONFIG).exists():
        raise SrtError(f"{BUNDLED}: no bundled model here; pass --model DIR")
    return BUNDLED


def check_model_dir(path: str | Path, tokenizer: bool = True) -> Path:
    """`path` as a Path if it is a local HF causal-LM directory (with its tokenizer files unless
    `tokenizer` is False), else a one-line SrtError."""
    path = check_dir(path)
    required = (CONFIG,) + (TOKENIZER_REQUIRED if tokenizer else ())
    missing = [f for f in required if not (path / f).is_file()]
    if missing:
        raise SrtError(f"{path}: not a model directory (missing {', '.join(missing)})")
    config = path / CONFIG
    try:
        data = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = getattr(e, "lineno", None)
        raise SrtError(f"{config}{f':{line}' if line else ''}: not valid JSON") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SrtError(f"{config}: not a model config (no model_type)")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise SrtError(f"{path}: not a model directory (no weights: expected {WEIGHT_FILES[0]})")
    return path


def load_tokenizer(path: str | Path):
    """The tokenizer of a local model directory (offline), fit to generate: it must have an eos
    token. (`srtcli.tokenizers.load_tokenizer` needs only the tokenizer files: `cache add`.)"""
    from srtcli import tokenizers

    tok = tokenizers.load_tokenizer(check_model_dir(path))
    if tok.eos_token_id is None:
        raise SrtError(f"{path}: the tokenizer has no eos token (set eos_token in tokenizer_config.json)")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # batching needs a pad id; it is always masked out
    return tok


def load_model(path: Path, dtype: Any, **options: Any):
    """The causal LM of a checked directory, offline, in eval mode, its attention checked;
    `options` go to `from_pretrained` (e.g. `attn_implementation`)."""
    from transformers import AutoModelForCausalLM

    from srtcli.attention_support import check_attention

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype, **options)
    except Exception as e:  # transformers raises many types; the user needs one line
        raise SrtError(f"{path}: cannot load the model: {type(e).__name__}: {first_line(e)}") from None
    model.eval()
    in_memory(model)
    check_attention(model, path)  # before anything runs: exact, or refused in one line
    return model


def cache_keyword(model: Any) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` where transformers renamed it
    (5.2x; `past_key_values` still works there, with a deprecation warning on every run), else
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward with `use_cache=True` returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def in_memory(model: Any) -> None:
    """Copy weights that still map the weights file into process memory. transformers leaves a
    CPU model's safetensors weights memory-mapped, and pages the kernel drops under memory
    pressure are read back from disk inside a forward (rollout epochs of the 135M real model at
    times took 5-20x their usual time here while its weights were mapped). One tensor at a time, so the peak is
    one tensor more; tied weights stay tied (one Parameter)."""
    for p in model.parameters():
        if p.device.type == "cpu":
            p.data = p.data.clone()


def load_model_and_tokenizer(path: str | Path | None = None, dtype: str = "float32"):
    """(model, tokenizer) from a local HF directory (default: the bundled model), in eval mode."""
    import torch

    path = check_model_dir(default_model_dir() if path is None else path)
    tok = load_tokenizer(path)
    return load_model(path, getattr(torch, dtype)), tok


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files `src` has into `dst` (so a checkpoint loads as a model with its
    tokenizer and chat template); returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
            copied.append(name)
    return copied
