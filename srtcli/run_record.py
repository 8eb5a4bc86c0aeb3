"""What defines a run, recorded when it starts so that `--resume` can refuse a changed one.

A record maps flag names (`--temperature`, `-n`, `--model`) to the values that decide what the
run produces. `srt rollout` keeps its record beside the pool (srtcli.rollout.pool_guard), `srt train`
in every checkpoint (srtcli.train.resume); on `--resume` each compares the recorded values
with the new ones (`mismatches`) and refuses a difference in one line naming the option and
both values.

Files are recorded by content, never by path or modification time, so a model or data set may
be moved or copied between runs. `files_digest` hashes each file's name and size and its bytes:
all of them for a file up to `WHOLE_BYTES` (64 MiB), else `SAMPLES` evenly spaced 64 KiB
windows (4 MiB read, milliseconds for any size of model). A training step changes every
weight, so a checkpoint trained further, or another model, is noticed; an edit confined to
the unsampled bytes of a file over 64 MiB would not be.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

WHOLE_BYTES = 64 << 20
SAMPLES = 64
WINDOW = 64 << 10

# the files of a model directory that decide what it computes and how it tokenizes
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
               "chat_template.jinja", "chat_template.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")


def _file_hash(h: Any, path: Path, name: str) -> None:
    size = path.stat().st_size
    h.update(f"{name}\0{size}\0".encode())
    with open(path, "rb") as f:
        if size <= WHOLE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return
        for i in range(SAMPLES):
            f.seek((size - WINDOW) * i // (SAMPLES - 1))
            h.update(f.read(WINDOW))


def files_digest(files: Iterable[Path], named: bool = True) -> str:
    """A content digest of files (names unless not `named`, sizes, bytes; see the module)."""
    h = hashlib.sha256()
    for path in files:
        _file_hash(h, Path(path), Path(path).name if named else "")
    return h.hexdigest()


def model_files(model_dir: Path) -> list[Path]:
    """The files of a model directory that its digest covers: config, tokenizer, weights."""
    model_dir = Path(model_dir)
    named = [model_dir / n for n in MODEL_FILES if (model_dir / n).is_file()]
    weights = sorted(p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    return named + weights


def file_entry(path: Path, files: Iterable[Path] | None = None) -> dict[str, str]:
    """A record value for a file or directory: its path (shown) and content digest (compared).

    A directory's digest covers `files` (default: `model_files`) by name; a file's, its bytes."""
    path = Path(path)
    if files is None and not path.is_dir():
        return {"path": str(path.resolve()), "digest": files_digest([path] if path.is_file() else [], named=False)}
    return {"path": str(path.resolve()), "digest": files_digest(model_files(path) if files is None else files)}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict) and "digest" in a and "digest" in b:
        return a["digest"] == b["digest"]
    return a == b


def show(value: Any) -> str:
    """A record value as a message shows it."""
    if isinstance(value, dict) and "digest" in value:
        return f"{value.get('path')} (content {str(value['digest'])[:12]})"
    return "not set" if value is None else str(value)


def mismatches(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`--flag: recorded X, now Y` for each option whose value differs (keys in both only)."""
    return [f"{k}: recorded {show(recorded[k])}, now {show(now[k])}"
            for k in now if k in recorded and not _same(recorded[k], now[k])]
