"""Tokenizers for the cache: loading one from a model directory, fingerprinting it, and
turning prompts and responses into token ids.

A cache key is `prompt_uid(prompt_ids, fingerprint)` (cache_store.uid). The fingerprint
identifies what token ids *mean*: a hash of the vocabulary (token -> id, sorted) and of the
special and added tokens. Two tokenizers with the same fingerprint give the same ids the
same strings, so their trees may be shared; any difference in the vocabulary separates them.

Prompts are encoded the way a chat model sees them: a list of messages (or a plain string,
taken as one user message) goes through the tokenizer's chat template with
add_generation_prompt=True; a tokenizer without a chat template encodes a plain string
as is. Anything that builds prompt ids for the cache (`srt rollout`, `srt cache add`)
must use `encode_prompt`, or the same prompt would get two uids.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError

# the files a tokenizer (with its chat template) may consist of: a directory with none of them
# has no tokenizer, and a checkpoint copies those its model directory has
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


def check_dir(model_dir: str | Path) -> Path:
    """`model_dir` as a Path if it is an existing directory, else a one-line SrtError."""
    path = Path(model_dir)
    if not path.exists():
        raise SrtError(f"{path}: model directory not found")
    if not path.is_dir():
        raise SrtError(f"{path}: not a directory (--model takes a Hugging Face model directory)")
    return path


def load_tokenizer(model_dir: str | Path) -> Any:
    """The HF tokenizer of a local model directory (offline); a one-line SrtError otherwise."""
    path = check_dir(model_dir)
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise SrtError(f"{path}: not a model directory (no tokenizer files: {', '.join(TOKENIZER_FILES)})")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many types; the user needs one line
        text = str(e).strip().splitlines()
        raise SrtError(f"{path}: cannot load the tokenizer: {type(e).__name__}: {text[0] if text else ''}") from None


def tokenizer_fingerprint(tok: Any) -> str:
    """A stable hash of what the tokenizer's ids mean: vocabulary plus special/added tokens."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    special = sorted(str(t) for t in getattr(tok, "all_special_tokens", []) or [])
    added = sorted((str(k), int(v)) for k, v in (tok.get_added_vocab() or {}).items())
    blob = json.dumps({"vocab": vocab, "special": special, "added": added}, ensure_ascii=False,
                      separators=(",", ":"))
    return "tok1-" + hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def encode_prompt(tok: Any, prompt: str | list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
    """A prompt's ids: chat template with add_generation_prompt=True (see the module doc), showing
    the model `tools` (JSON schemas) when given."""
    template = getattr(tok, "chat_template", None)
    if isinstance(prompt, str) and not template:
        return list(tok(prompt, add_special_tokens=True)["input_ids"])
    if not template:
        raise ValueError("the prompt is a list of chat messages but the tokenizer has no chat template")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    text = tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def encode_response(tok: Any, text: str) -> list[int]:
    """A response's ids: the text as is, no special tokens added."""
    return list(tok(text, add_special_tokens=False)["input_ids"])
