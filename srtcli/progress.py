"""The one progress display of every long-running command.

Library code reports progress through a `Bar` (`advance`, `update`); what it shows is decided
here, once: a rich bar on stderr while stdout is a terminal and no `--json` object is due, and
nothing otherwise (a pipe, a file, CI), so machine-readable output is never interleaved with it.
A known total shows a bar with a count and the time left; no total (work of unknown size) shows a
spinner with the count so far.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator


class Bar:
    """Progress of one piece of work; a no-op when nothing is shown."""

    def __init__(self, progress: Any = None, task: Any = None):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(self, completed: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed)


def shown(as_json: bool = False) -> bool:
    """Whether a progress bar is shown: on a terminal, and not when `--json` owns stdout."""
    return not as_json and sys.stdout.isatty()


@contextmanager
def progress(label: str, total: int | None = None, completed: int = 0, as_json: bool = False,
             console: Any = None) -> Iterator[Bar]:
    """A `Bar` for the length of a block (transient: it is gone when the block ends)."""
    if not shown(as_json):
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = ((TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()) if total is not None
               else (SpinnerColumn(), TextColumn(label + ": {task.completed:,}"), TimeElapsedColumn()))
    with Progress(*columns, console=console or Console(stderr=True), transient=True) as bar:
        yield Bar(bar, bar.add_task(label, total=total, completed=completed))
