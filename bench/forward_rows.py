"""Where a rollout's forwards go: how many rows each of the embedded engine's forwards carried.

A rollout batch lasts as long as its longest sample, so some forwards run a full batch and some
the long tail's few rows; a drafter saves forwards in both, and a change aimed at one shows only
in its part. `count_rows()` records every forward's row count while it is open (it wraps
`Engine._run`, the one place a forward's rows are known; the engine runs unchanged), and
`by_fill` sorts them by how full the batch was.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from srtcli.rollout.engine.engine import Engine

FILLS = (1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)  # upper bounds, as shares of the slots


@contextmanager
def count_rows() -> Iterator[list[int]]:
    """The row count of every forward run while open, in order."""
    rows: list[int] = []
    run = Engine._run

    def counted(self, batch, props):
        rows.append(len(batch))
        return run(self, batch, props)

    Engine._run = counted
    try:
        yield rows
    finally:
        Engine._run = run


def by_fill(rows: list[int], slots: int) -> list[tuple[str, int]]:
    """(rows range, forwards) per share of `slots` the forwards filled (FILLS), emptiest first."""
    out, low = [], 0
    for high in sorted({min(slots, max(1, round(slots * share))) for share in FILLS}):
        out.append((f"{low + 1}-{high}" if high > low + 1 else str(high), sum(low < r <= high for r in rows)))
        low = high
    return out
