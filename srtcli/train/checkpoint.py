"""Checkpoints of `srt train`: Hugging Face weights plus what `--resume` needs.

Layout of `--out`:

    out/config.json, model.safetensors, tokenizer files   the final model (`srt rollout --model out`)
    out/checkpoints/step-00000010/                        HF files + trainer_state.pt
    out/metrics.jsonl                                     one JSON object per optimizer step

`trainer_state.pt` holds the optimizer, the LR scheduler, the optimizer step and the RNG
states; the data position follows from the step (the batch plan is deterministic), so a
resumed run continues exactly where the checkpoint was taken.

A checkpoint is written into a temporary directory and renamed into place, so a run killed
while saving leaves the previous checkpoint intact. The final model at the root is linked
(or copied) file by file from the last checkpoint, each file replaced atomically.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srtcli.models import copy_tokenizer_files

STATE = "trainer_state.pt"
CKPT_DIR = "checkpoints"


def step_dir(out: Path, step: int) -> Path:
    return Path(out) / CKPT_DIR / f"step-{step:08d}"


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def optimizer_state_by_name(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names instead of indices.

    Checkpoints store this form, the one FSDP's full optimizer state dict uses, so that a run
    can resume sharded or not, with any world size."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_index(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `optimizer_state_by_name`, for `Optimizer.load_state_dict`."""
    index = {n: i for i, (n, p) in enumerate((n, p) for n, p in model.named_parameters() if p.requires_grad)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[n]: v for n, v in state["state"].items()}, "param_groups": groups}


def save_checkpoint(
    out: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    tokenizer_src: Path,
    extra: dict[str, Any],
    model_state: dict | None = None,
    optim_state: dict | None = None,
) -> Path:
    """Write `out/checkpoints/step-N` atomically; returns its path.

    `model_state` / `optim_state` replace the modules' own state dicts (FSDP gathers full
    ones, see srtcli.train.fsdp)."""
    final = step_dir(out, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), state_dict=model_state)
    copy_tokenizer_files(tokenizer_src, tmp)
    torch.save(
        {
            "step": step,
            "optimizer": optim_state if optim_state is not None else optimizer_state_by_name(model, optimizer.state_dict()),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "extra": extra,
        },
        tmp / STATE,
    )
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def publish_final(out: Path, ckpt: Path) -> None:
    """Make `out` itself a loadable model: the checkpoint's files minus the trainer state."""
    out = Path(out)
    for f in sorted(ckpt.iterdir()):
        if not f.is_file() or f.name == STATE:
            continue
        tmp = out / f".{f.name}.tmp-{os.getpid()}"
        if tmp.exists():
            tmp.unlink()
        try:
            os.link(f, tmp)  # no second copy of the weights on disk
        except OSError:
            shutil.copy2(f, tmp)
        os.replace(tmp, out / f.name)


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the highest step under `out`, if any."""
    root = Path(out) / CKPT_DIR
    if not root.is_dir():
        return None
    found = []
    for d in root.iterdir():
        if d.is_dir() and d.name.startswith("step-") and (d / STATE).is_file():
            try:
                found.append((int(d.name[5:]), d))
            except ValueError:
                continue
    return max(found)[1] if found else None


def remove_partial(out: Path) -> None:
    """Delete half-written checkpoints (temporary directories) that a killed run left."""
    root = Path(out) / CKPT_DIR
    if root.is_dir():
        for d in root.glob(".step-*"):
            shutil.rmtree(d, ignore_errors=True)


def load_state(ckpt: Path) -> dict[str, Any]:
    # our own file: it holds python RNG tuples and numpy state, so not weights-only
    return torch.load(ckpt / STATE, map_location="cpu", weights_only=False)


def has_run(out: Path) -> bool:
    """Whether `out` already holds (part of) a training run."""
    out = Path(out)
    return (out / "metrics.jsonl").exists() or (out / CKPT_DIR).exists() or (out / "config.json").exists()
