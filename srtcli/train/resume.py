"""What `srt train --resume` may change, and what it refuses.

Every checkpoint records the run that wrote it (`run_definition`: flag names to values, the
model and the data by content digest; srtcli.run_record). Resuming compares that record
with the new options (`check_resume`):

- refused, one line naming each option with both values: the data (`--steps`/`--shards`),
  `--model` (the reference model by default, and where the tokenizer comes from),
  `--ref-model`, and every optimizer, loss or schedule hyperparameter (`REFUSED`): the
  checkpoint's optimizer state would silently keep the old learning rate, and a different
  loss would make the run neither the old one nor a new one;
- allowed, said in one line: `--epochs` and `--max-steps` (they extend or cut the same batch
  plan), except that with `--lr-schedule cosine` the plan's length is the schedule's and may
  not change; and `--seed` (the checkpoint's RNG state continues, so it has no effect);
- free, not recorded: `--micro-batch-tokens`, `--attn`, `--gradient-checkpointing`, `--save-every`,
  `--nproc`, `--fsdp`, `--skip-bad`, `--json` (they change speed or memory, not the result).

A checkpoint written before records existed has only its options: those are compared, and a
note says that the model and data could not be checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srtcli.errors import SrtError
from srtcli.run_record import file_entry, mismatches, show

REFUSED = ("--steps", "--shards", "--model", "--ref-model", "--lr", "--weight-decay", "--clip", "--kl-coef",
           "--loss-agg", "--grad-clip", "--dtype", "--batch-size", "--lr-schedule", "--warmup-steps", "--temperature",
           "--mixed-precision")
PLAN_LENGTH = ("--epochs", "--max-steps")
SCALARS = ("lr", "weight_decay", "clip", "kl_coef", "loss_agg", "grad_clip", "dtype", "batch_size",
           "lr_schedule", "warmup_steps", "epochs", "max_steps", "seed", "temperature", "mixed_precision")


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def data_files(steps: Path | None, shards: Path | None) -> list[Path]:
    """The files a run's data consists of (already validated by the loader)."""
    if steps is not None:
        from srtcli.pool import pool_files

        return pool_files(Path(steps))
    from srtcli.shards import MANIFEST, read_manifest

    manifest = read_manifest(Path(shards))
    return [Path(shards) / MANIFEST] + [Path(shards) / e["file"] for e in manifest.get("shards", [])]


def run_definition(cfg: Any, model_dir: Path, total: int) -> dict[str, Any]:
    """The record a checkpoint keeps of the run (see the module docstring); `total` is the
    plan's optimizer steps."""
    data = file_entry(Path(cfg.steps or cfg.shards), data_files(cfg.steps, cfg.shards))
    ref = None
    if cfg.kl_coef:
        ref = file_entry(Path(cfg.ref_model) if cfg.ref_model else model_dir)
    return {"--steps": data if cfg.steps is not None else None,
            "--shards": data if cfg.shards is not None else None,
            "--model": file_entry(model_dir), "--ref-model": ref,
            **{_flag(f): getattr(cfg, f) for f in SCALARS}, "plan_steps": total}


def recorded_run(extra: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(record, complete): a checkpoint's record, or what an older one kept (its options)."""
    if isinstance(extra.get("run"), dict):
        return extra["run"], True
    config = extra.get("config") or {}
    return {_flag(f): config[f] for f in SCALARS if f in config}, False


def check_resume(ckpt: Path, extra: dict[str, Any], now: dict[str, Any], total: int) -> list[str]:
    """Refuse a changed run (SrtError); returns the notes to print for allowed changes."""
    recorded, complete = recorded_run(extra)
    cosine = now["--lr-schedule"] == "cosine"
    keys = REFUSED + (PLAN_LENGTH if cosine and "plan_steps" not in recorded else ())
    diff = mismatches({k: recorded[k] for k in keys if k in recorded}, {k: now[k] for k in keys})
    if cosine and recorded.get("plan_steps", total) != total:
        diff.append(f"--epochs/--max-steps: recorded a cosine schedule of {recorded['plan_steps']} steps, now {total}")
    if diff:
        raise SrtError(f"{ckpt}: cannot resume a changed run: {'; '.join(diff)} (train into a new --out instead)")
    notes = []
    if not complete:
        notes.append(f"note: {ckpt} has no run record (written by an older srt): "
                     "the resumed run's model and data could not be checked")
    longer = mismatches({k: recorded[k] for k in PLAN_LENGTH if k in recorded and not cosine}, now)
    if longer:
        notes.append(f"note: resuming with {'; '.join(longer)}: the run now ends at step {total}")
    if "--seed" in recorded and recorded["--seed"] != now["--seed"]:
        notes.append(f"note: --seed {show(now['--seed'])} has no effect on resume "
                     f"(the checkpoint's RNG state, from --seed {show(recorded['--seed'])}, continues)")
    return notes
