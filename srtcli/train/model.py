"""Loading the policy (and reference) model for `srt train`, and what a checkpoint copies.

`srt train` needs no tokenizer, but a checkpoint must load with `srt rollout --model`, so the
tokenizer files of the source model directory (when it has them) are copied next to the
weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from srtcli.errors import SrtError

BUNDLED_MODEL = Path(__file__).resolve().parent.parent / "bundled_model"

# files a checkpoint carries over from the model directory (the tokenizer and chat template)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)

HF_ATTN = {"sdpa": "sdpa", "eager": "eager", "flex": "sdpa"}  # plain rows; packed rows pick their own


def resolve_model_dir(model: str | Path | None) -> Path:
    if model is None:
        if not (BUNDLED_MODEL / "config.json").exists():
            raise SrtError(f"{BUNDLED_MODEL}: no bundled model here; pass --model DIR")
        return BUNDLED_MODEL
    return Path(model)


def check_model_dir(path: Path) -> None:
    """A one-line error unless `path` looks like a Hugging Face causal-LM directory."""
    if not path.exists():
        raise SrtError(f"{path}: no such model directory")
    if not path.is_dir():
        raise SrtError(f"{path}: not a model directory (a file)")
    cfg = path / "config.json"
    if not cfg.exists():
        raise SrtError(f"{path}: not a model directory (no config.json)")
    try:
        data = json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SrtError(f"{cfg}: not valid JSON") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SrtError(f"{cfg}: not a model config (no model_type)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise SrtError(f"{path}: not a model directory (no weights: *.safetensors or *.bin)")


def load_model(path: Path, dtype: torch.dtype, attn: str, device: str) -> torch.nn.Module:
    """The causal LM in `path` on `device`; any loading failure is a one-line user error."""
    check_model_dir(path)
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, attn_implementation=HF_ATTN.get(attn, "sdpa"), local_files_only=True
        )
    except Exception as e:  # transformers raises many types; the user needs one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SrtError(f"{path}: cannot load the model ({first})") from None
    from srtcli.attention_support import check_attention

    check_attention(model, path)  # before anything is written: exact, or refused in one line
    return model.to(device)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files `src` has into `dst`; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
            copied.append(name)
    return copied
