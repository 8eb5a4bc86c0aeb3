"""Shards: the packed rows `srt pack` writes and `srt train` reads (layout: docs/formats.md).

A shard set is a directory with `manifest.json` and `shard-NNNNN.safetensors` files. Each
shard holds whole rows; per row `r` the tensors are

    r{r}.input_ids, r{r}.position_ids, r{r}.subtree_end   int32 [T_padded]
    r{r}.path_offsets                                      int64 [n+1]
    r{r}.paths                                             int32 [sum L]   (packed indices)
    r{r}.loss_mask                                         int8  [sum L]
    r{r}.old_logprobs                                      float64 [sum L]
    r{r}.reward, r{r}.advantage                            float64 [n]
    r{r}.step, r{r}.seq_ids                                int64 [n]

and the shard's safetensors metadata `rows` is JSON: per row `n_real` and per step
`prompt_uid`, `trajectory_id`, `meta`. Step i of a row is the sequence of path i, so a
step's input_ids are `input_ids[paths[off[i]:off[i+1]]]` and nothing else is needed to train.

Writing is all-or-nothing: a temporary sibling directory is renamed into place when complete,
so a failed or killed run never leaves a partial set. An existing `out` is replaced only with
`overwrite` and only while it holds nothing but a shard set (checked by `check_out`, and again
at the swap): never the input, a regular file or someone's directory.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from attention.rows import PackedRow
from srtcli.errors import SrtError
from srtcli.pool import StepRecord

FORMAT = "srt-shards"
VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class ShardRow:
    """A packed row and the steps of its paths (steps[i] <-> row.paths[i])."""

    row: PackedRow
    steps: list[StepRecord]


def _row_tensors(r: int, sr: ShardRow) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    row, steps = sr.row, sr.steps
    if len(steps) != len(row.paths):
        raise ValueError(f"row {r}: {len(row.paths)} paths but {len(steps)} steps")
    lens = [p.numel() for p in row.paths]
    off = torch.zeros(len(lens) + 1, dtype=torch.int64)
    off[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    cat = lambda xs, dt: torch.tensor(list(chain.from_iterable(xs)), dtype=dt)  # noqa: E731
    t = {
        "input_ids": row.input_ids.to(torch.int32),
        "position_ids": row.position_ids.to(torch.int32),
        "subtree_end": row.subtree_end.to(torch.int32),
        "path_offsets": off,
        "paths": torch.cat(row.paths).to(torch.int32),
        "loss_mask": cat([s.loss_mask for s in steps], torch.int8),
        "old_logprobs": cat([s.old_logprobs for s in steps], torch.float64),
        "reward": torch.tensor([s.reward for s in steps], dtype=torch.float64),
        "advantage": torch.tensor([s.advantage for s in steps], dtype=torch.float64),
        "step": torch.tensor([s.step for s in steps], dtype=torch.int64),
        "seq_ids": torch.tensor(row.seq_ids, dtype=torch.int64),
    }
    meta = {
        "n_real": row.n_real,
        "steps": [{"prompt_uid": s.prompt_uid, "trajectory_id": s.trajectory_id, "meta": s.meta} for s in steps],
    }
    return {f"r{r}.{k}": v.contiguous() for k, v in t.items()}, meta


@dataclass(frozen=True)
class ShardTarget:
    """An output directory `check_out` accepted: the only kind `write_shards` writes to."""

    path: Path
    overwrite: bool


def write_shards(target: ShardTarget, rows: Iterable[ShardRow], summary: dict[str, Any],
                 rows_per_shard: int = 64) -> dict[str, Any]:
    """Write a complete shard set to `target` atomically; returns the manifest. Every step
    must carry its advantage (`srtcli.advantages.grpo_advantages` fills it)."""
    out = target.path
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # a plain mkdir honours the umask, so the finished set gets normal permissions
    try:
        shards = _write_all(tmp, list(rows), max(1, rows_per_shard), 0o666 & ~_umask())
        manifest = {"format": FORMAT, "version": VERSION, **summary, "shards": shards}
        _write_json(tmp / MANIFEST, manifest)
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def check_out(out: Path, overwrite: bool, inputs: Iterable[Path] = ()) -> ShardTarget:
    """`out` as a target, unless writing it would destroy anything but a previous shard set.

    A missing `out` or an empty directory is written; with `overwrite`, so is a directory that
    holds nothing but a shard set (its manifest and shard files). Never a regular file, a
    symbolic link, a directory with anything else in it, or one that holds an input."""
    out = Path(out)
    for p in inputs:
        if _contains(out, Path(p)):
            raise SrtError(f"{out}: holds the input {p} (choose another --out)")
    if out.is_symlink():
        raise SrtError(f"{out}: is a symbolic link (pass the directory it points to as --out)")
    if out.exists() and not out.is_dir():
        raise SrtError(f"{out}: exists and is not a directory (--out must be a shards directory)")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise SrtError(f"{out}: already exists (choose another --out, or --overwrite)")
        _check_only_a_shard_set(out)
    return ShardTarget(out, overwrite)


def _contains(out: Path, p: Path) -> bool:
    out, p = out.resolve(), p.resolve()
    return p == out or out in p.parents


_SHARD_FILE = re.compile(r"shard-\d{5,}\.safetensors")


def _check_only_a_shard_set(out: Path) -> None:
    """`--overwrite` deletes `out`: allowed only for a shard set and nothing else."""
    mf = out / MANIFEST
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SrtError(f"{out}: not a shard set (no srt manifest.json); --overwrite replaces only an `srt pack` output")
    for p in sorted(out.iterdir()):
        if p.is_symlink() or not p.is_file() or not (p.name == MANIFEST or _SHARD_FILE.fullmatch(p.name)):
            raise SrtError(f"{p}: not part of a shard set; --overwrite replaces only a directory holding nothing else")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(out: Path) -> None:
    """Remove temporary sets that killed runs for the same `out` left behind."""
    for p in out.parent.glob(f".{out.name}.tmp-*"):
        pid = p.name.rsplit(".tmp-", 1)[1].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _umask() -> int:
    """The process umask, read when a set is written (reading it means setting it: put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_all(tmp: Path, rows: list[ShardRow], per: int, mode: int) -> list[dict[str, Any]]:
    shards = []
    for s, start in enumerate(range(0, len(rows), per)):
        tensors: dict[str, torch.Tensor] = {}
        metas = []
        for r, sr in enumerate(rows[start : start + per]):
            for st in sr.steps:
                if st.advantage is None:
                    raise ValueError("every step needs an advantage before it is written")
            t, m = _row_tensors(r, sr)
            tensors.update(t)
            metas.append(m)
        name = f"shard-{s:05d}.safetensors"
        save_file(tensors, str(tmp / name), metadata={"format": FORMAT, "rows": json.dumps(metas)})
        os.chmod(tmp / name, mode)  # safetensors creates its files private
        _fsync(tmp / name)
        shards.append({"file": name, "rows": len(metas)})
    return shards


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_into_place(tmp: Path, target: ShardTarget) -> None:
    """Rename the finished set over `out`; an old set is moved aside first, then removed.
    A directory filled since `check_out` is refused (with `overwrite` unless it is still only a
    shard set; without, by the rename itself)."""
    out, old = target.path, None
    if target.overwrite and out.exists():
        if any(out.iterdir()):
            _check_only_a_shard_set(out)
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        raise SrtError(f"{out}: already exists (choose another --out, or --overwrite)") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a shard set; a missing or foreign one is a one-line user error."""
    mf = Path(path) / MANIFEST
    if not mf.exists():
        raise SrtError(f"{mf}: missing (not an `srt pack` output directory)")
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SrtError(f"{mf}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SrtError(f"{mf}: not an srt shards manifest")
    if manifest.get("version") != VERSION:
        raise SrtError(f"{mf}: shards version {manifest.get('version')}, this srt reads {VERSION}")
    return manifest


def _rows_of(path: Path) -> list[ShardRow]:
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            metas = json.loads((f.metadata() or {})["rows"])
    except (SafetensorError, KeyError, json.JSONDecodeError, OSError) as e:
        raise SrtError(f"{path}: not a readable shard ({e})") from None
    rows = []
    for r, m in enumerate(metas):
        g = lambda k: tensors[f"r{r}.{k}"]  # noqa: E731
        off = g("path_offsets").tolist()
        flat = g("paths").long()
        paths = [flat[a:b] for a, b in zip(off[:-1], off[1:])]
        ids = g("input_ids").long()
        row = PackedRow(ids, g("position_ids").long(), g("subtree_end").long(), paths, g("seq_ids").tolist(), int(m["n_real"]))
        mask, olp = g("loss_mask").tolist(), g("old_logprobs").tolist()
        reward, adv, step = g("reward").tolist(), g("advantage").tolist(), g("step").tolist()
        steps = [
            StepRecord(
                prompt_uid=sm["prompt_uid"],
                trajectory_id=sm["trajectory_id"],
                step=step[i],
                input_ids=ids[paths[i]].tolist(),
                loss_mask=mask[off[i] : off[i + 1]],
                old_logprobs=olp[off[i] : off[i + 1]],
                reward=reward[i],
                advantage=adv[i],
                meta=sm.get("meta") or {},
            )
            for i, sm in enumerate(m["steps"])
        ]
        rows.append(ShardRow(row, steps))
    return rows


def load_shards(path: Path) -> tuple[dict[str, Any], list[ShardRow]]:
    """(manifest, rows) of a shard set written by `write_shards`."""
    path = Path(path)
    manifest = read_manifest(path)
    rows: list[ShardRow] = []
    for entry in manifest.get("shards", []):
        f = path / entry["file"]
        if not f.exists():
            raise SrtError(f"{f}: listed in the manifest but missing")
        rows.extend(_rows_of(f))
    return manifest, rows
