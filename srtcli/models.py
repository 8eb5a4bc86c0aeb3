"""Where models come from: the bundled model, and loading any local HF model directory.

srt ships a small Llama trained from scratch on the arith workload (examples/arith/), in
standard Hugging Face format under `srtcli/bundled_model/`, so `srt rollout` works right after
install with no download. Commands use `default_model_dir()` when `--model` is not given and
`load_model_and_tokenizer(dir)` to load one; a missing or non-model directory is a one-line
`SrtError`, never a traceback from transformers. Loading is always offline (local files only).
A loaded model passes `srtcli.attention_support.check_attention` (its attention is one srt
computes exactly) before any command uses it.
"""

from __future__ import annotations

import json
from pathlib import Path

from srtcli.errors import SrtError, first_line

BUNDLED = Path(__file__).resolve().parent / "bundled_model"
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def default_model_dir() -> Path:
    """The bundled model's directory (inside the installed package)."""
    return BUNDLED


def check_model_dir(path: str | Path) -> Path:
    """`path` as a Path if it looks like a local HF causal-LM directory, else a one-line SrtError."""
    from srtcli.tokenizers import check_dir

    path = check_dir(path)
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise SrtError(f"{path}: not a model directory (missing {', '.join(missing)})")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise SrtError(f"{path}: not a model directory (no weights: expected {WEIGHT_FILES[0]})")
    try:
        json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = getattr(e, "lineno", None)
        raise SrtError(f"{path / 'config.json'}{f':{line}' if line else ''}: not valid JSON") from None
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


def load_model_and_tokenizer(path: str | Path | None = None, dtype: str = "float32"):
    """(model, tokenizer) from a local HF directory (default: the bundled model), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from srtcli.attention_support import check_attention

    path = check_model_dir(default_model_dir() if path is None else path)
    tok = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=getattr(torch, dtype))
    except Exception as e:
        raise SrtError(f"{path}: cannot load the model: {type(e).__name__}: {first_line(e)}") from None
    model.eval()
    check_attention(model, path)  # before anything is generated: exact, or refused in one line
    return model, tok

