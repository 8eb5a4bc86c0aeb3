"""The steps pool: the contract between `srt rollout`, `srt pack`, `srt train` and `srt cache add`.

A pool is a directory of `*.jsonl` (or `*.jsonl.zst`) files, one step per line. The format is
documented in docs/formats.md; this module is its only reader and writer:

- `read_pool(dir)` validates every line and returns `StepRecord`s (errors name file and line;
  a (prompt_uid, trajectory_id, step) seen twice is an error too);
- `PoolWriter` appends whole lines, crash-safe, and can resume a file a killed run left behind.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from srtcli.errors import SrtError, at
from srtcli.jsonl import read_lines, split_lines

REQUIRED = ("prompt_uid", "trajectory_id", "step", "input_ids", "loss_mask", "old_logprobs", "reward")


@dataclass
class StepRecord:
    """One model turn: the whole sequence up to and including this turn's response."""

    prompt_uid: str
    trajectory_id: str
    step: int
    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    reward: float
    advantage: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        # Built by hand: dataclasses.asdict deep-copies every list (~80 us a step, a visible
        # share of a small model's rollout).
        d = {f: getattr(self, f) for f in REQUIRED}
        if self.advantage is not None:
            d["advantage"] = self.advantage
        if self.meta:
            d["meta"] = self.meta
        return json.dumps(d, separators=(",", ":"))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def _step_object(text: str) -> dict[str, Any]:
    """The line's JSON object, with every required field present."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise ValueError("a step must be a JSON object")
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    return d


def _check_keys(d: dict[str, Any]) -> None:
    for k in ("prompt_uid", "trajectory_id"):
        if not isinstance(d[k], str) or not d[k]:
            raise ValueError(f"`{k}` must be a non-empty string")
    if not _is_int(d["step"]) or d["step"] < 0:
        raise ValueError("`step` must be an integer >= 0")


def _check_tokens(ids: Any, mask: Any, lps: Any) -> None:
    """input_ids, loss_mask and old_logprobs: well typed, one entry per token."""
    if not isinstance(ids, list) or not ids or not all(_is_int(t) for t in ids):
        raise ValueError("`input_ids` must be a non-empty list of integers")
    if any(t < 0 for t in ids):
        raise ValueError("`input_ids` has a negative token id")
    if not isinstance(mask, list) or any(m not in (0, 1) or isinstance(m, bool) for m in mask):
        raise ValueError("`loss_mask` must be a list of 0/1")
    if not isinstance(lps, list) or not all(_is_num(x) for x in lps):
        raise ValueError("`old_logprobs` must be a list of finite numbers")
    if not (len(ids) == len(mask) == len(lps)):
        raise ValueError(
            f"lengths disagree: input_ids {len(ids)}, loss_mask {len(mask)}, old_logprobs {len(lps)}"
        )
    if mask[0] == 1:
        raise ValueError("`loss_mask` must be 0 on the first token (nothing predicts it)")


def _check_scalars(d: dict[str, Any]) -> None:
    if not _is_num(d["reward"]):
        raise ValueError("`reward` must be a finite number")
    adv = d.get("advantage")
    if adv is not None and not _is_num(adv):
        raise ValueError("`advantage` must be a finite number")
    if not isinstance(d.get("meta") or {}, dict):
        raise ValueError("`meta` must be an object")


def parse_step(text: str) -> StepRecord:
    """Parse and validate one JSON line; raises ValueError with a short reason."""
    d = _step_object(text)
    _check_keys(d)
    _check_tokens(d["input_ids"], d["loss_mask"], d["old_logprobs"])
    _check_scalars(d)
    adv = d.get("advantage")
    return StepRecord(
        prompt_uid=d["prompt_uid"],
        trajectory_id=d["trajectory_id"],
        step=d["step"],
        input_ids=d["input_ids"],
        loss_mask=d["loss_mask"],
        old_logprobs=[float(x) for x in d["old_logprobs"]],
        reward=float(d["reward"]),
        advantage=None if adv is None else float(adv),
        meta=d.get("meta") or {},
    )


def pool_files(pool: Path) -> list[Path]:
    """The pool's files in a stable order; a missing or empty pool is a user error."""
    pool = Path(pool)
    if not pool.exists():
        raise SrtError(f"{pool}: no such steps pool")
    if pool.is_file():
        files = [pool]
    else:
        files = sorted(p for p in pool.iterdir() if p.name.endswith((".jsonl", ".jsonl.zst")))
    if not files:
        raise SrtError(f"{pool}: empty steps pool (no *.jsonl or *.jsonl.zst files)")
    return files


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a pool file, plain or zstd (srtcli.jsonl splits and decodes)."""
    if not path.name.endswith(".zst"):
        yield from read_lines(path)
        return
    import zstandard

    with open(path, "rb") as raw:
        try:
            reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
            yield from split_lines(reader, path)
        except zstandard.ZstdError as e:
            raise SrtError(f"{path}: not a valid zstd file ({e})") from None


def iter_steps(pool: Path, skip_bad: bool = False, stats: dict | None = None) -> Iterator[StepRecord]:
    """Stream the pool's steps. Bad lines raise `path:line: reason`, or are counted and
    skipped (`stats["skipped"]`) with skip_bad. Blank lines are ignored."""
    if stats is not None:
        stats.setdefault("skipped", 0)
    seen: dict[tuple[str, str, int], str] = {}
    for path in pool_files(pool):
        for lineno, text in _lines(path):
            if not text.strip():
                continue
            try:
                step = _first_of_its_kind(parse_step(text), seen, f"{path.name}:{lineno}")
            except ValueError as e:
                if not skip_bad:
                    raise at(path, lineno, str(e)) from None
                if stats is not None:
                    stats["skipped"] += 1
                continue
            yield step


def _first_of_its_kind(step: StepRecord, seen: dict[tuple[str, str, int], str], here: str) -> StepRecord:
    """`step`, unless the pool already had this (prompt, trajectory, step): a pool written
    twice over would count those trajectories twice in their group's advantages."""
    first = seen.setdefault((step.prompt_uid, step.trajectory_id, step.step), here)
    if first != here:
        raise ValueError(f"duplicate step: trajectory {step.trajectory_id!r} step {step.step} "
                         f"(prompt_uid {step.prompt_uid!r}) is already at {first}")
    return step


def read_pool(pool: Path, skip_bad: bool = False, stats: dict | None = None) -> list[StepRecord]:
    """All steps of a pool, validated; an empty result is a user error."""
    steps = list(iter_steps(pool, skip_bad, stats))
    if not steps:
        raise SrtError(f"{pool}: the steps pool holds no valid step")
    return steps


class PoolWriter:
    """Appends steps to one pool file, a whole line per write, flushed and fsynced.

    A process killed mid-write can leave at most one partial last line; `resume=True`
    cuts it off before appending, so the file again holds only whole lines.
    """

    def __init__(self, path: Path, resume: bool = False, fsync_every: int = 1):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            truncate_partial_line(self.path)
        elif not resume and self.path.exists() and self.path.stat().st_size > 0:
            raise SrtError(f"{self.path}: already exists (use --resume to continue it)")
        self._f = open(self.path, "ab")
        self._fsync_every = max(1, fsync_every)
        self._pending = 0

    def write(self, step: StepRecord) -> None:
        self._f.write((step.to_json() + "\n").encode())
        self._pending += 1
        if self._pending >= self._fsync_every:
            self.flush()

    def flush(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._pending = 0

    def close(self) -> None:
        if not self._f.closed:
            self.flush()
            self._f.close()

    def __enter__(self) -> "PoolWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def truncate_partial_line(path: Path) -> None:
    """Cut a trailing line that has no newline (a write interrupted by a kill)."""
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            f.truncate(keep)
