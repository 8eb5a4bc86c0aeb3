"""Metrics of `srt train`: one JSON line per optimizer step in metrics.jsonl, and the console.

Only rank 0 reports. The console gets one rich line per step (stderr when `--json` keeps
stdout for the summary) and the one progress display, `srtcli.progress` (shown only on a
terminal, without `--json`). metrics.jsonl lines are written whole and flushed; on `--resume`,
lines of steps after the checkpoint (work that will be redone) and a partial last line are
dropped first.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from srtcli.progress import Bar, progress

METRICS = "metrics.jsonl"


def trim_metrics(path: Path, upto_step: int) -> None:
    """Keep only whole lines of steps <= upto_step (atomic rewrite)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # blank or the partial line of a killed run
        if isinstance(rec, dict) and int(rec.get("step", 0)) <= upto_step:
            keep.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    os.replace(tmp, path)


def format_line(rec: dict[str, Any], total: int) -> str:
    return (
        f"[bold]step {rec['step']}/{total}[/bold]  loss {rec['loss']:.5g}  clip {rec['clip_frac']:.3f}  "
        f"kl {rec['kl']:.3g}  grad {rec['grad_norm']:.4g}  lr {rec['lr']:.3g}  "
        f"tokens {rec['tokens']} packed {rec['packed_tokens']} ({rec['token_ratio']:.3f})  "
        f"{rec['tokens_per_s']:.0f} tok/s"
    )


class Reporter:
    """Writes metrics.jsonl and the console lines (rank 0 only; a no-op elsewhere)."""

    def __init__(self, out: Path, enabled: bool, json_mode: bool, total: int, start: int):
        self.enabled = enabled
        self.total = total
        self.console = Console(stderr=json_mode, highlight=False, soft_wrap=True)
        self._file = open(Path(out) / METRICS, "a", encoding="utf-8") if enabled else None
        self._stack = ExitStack()
        self._bar = Bar()
        if enabled:  # shown only on a terminal without --json (srtcli.progress)
            self._bar = self._stack.enter_context(progress("train", total, start, json_mode, self.console))

    def info(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def step(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self._file is not None
        self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._file.flush()
        self.console.print(format_line(rec, self.total))
        self._bar.update(rec["step"])

    def close(self) -> None:
        self._stack.close()
        self._bar = Bar()
        if self._file is not None:
            self._file.close()
            self._file = None
