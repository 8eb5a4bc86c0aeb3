"""When the vLLM proposer commits: its commit settings, the prompts it keeps, and its idle clock.

No driver says when a group of samples is done, so the proposer's tree session works per
sequence: each is stored when it ends, by the session's one commit rule (`commit_every`
sequences or `commit_seconds`, here from the environment), checked after every engine step and,
when vLLM is idle, by the proposer's idle thread (`StepClock` says when), and at the end of a
rollout batch or of the process. A prompt's tree stays in memory while any of its sequences is
live and after that among the `IDLE_GROUPS` most recently idle prompts, so samples of it that
come later (more samples than the batch holds, the next epoch on the same server) draft from
the same tree, sequences not yet committed included. What a killed worker loses is the queued
sequences: each append is atomic (per prompt on a server), so the store is never left
half-written; a lost server is retried and what it never took is spilled to a local store for
`srt cache import` (`srtcli.store_link`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from srtcli.rollout.tree_session import COMMIT_EVERY, COMMIT_SECONDS

IDLE_GROUPS = 64  # prompt trees kept in memory after their last live sequence ended
EVERY_ENV, SECONDS_ENV = "SRT_VLLM_COMMIT_EVERY", "SRT_VLLM_COMMIT_SECONDS"
IDLE_GAPS = 4  # vLLM is idle after this many of its (slow) step intervals without a step


class StepClock:
    """When vLLM last stepped, and when that means it is idle: `seconds` without a step, or
    `IDLE_GAPS` times its steps' interval if they are slower (the second longest of the last
    16: a pause between requests is one long interval, slow steps are many)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.intervals: deque[float] = deque(maxlen=16)

    def tick(self) -> None:
        """At the start and end of every step (the interval between is the model's step)."""
        now = time.monotonic()
        self.intervals.append(now - self.last)
        self.last = now

    def idle_after(self, seconds: float) -> float:
        slow = sorted(self.intervals)[-2] if len(self.intervals) > 1 else 0.0
        return max(seconds, IDLE_GAPS * slow)

    def idle(self, seconds: float) -> bool:
        return time.monotonic() - self.last >= self.idle_after(seconds)


def commit_settings() -> tuple[int, float]:
    """(sequences per append, seconds), from `$SRT_VLLM_COMMIT_EVERY` / `$SRT_VLLM_COMMIT_SECONDS`
    if set; a bad value is one SrtError line."""
    from srtcli.errors import SrtError

    every, seconds = os.environ.get(EVERY_ENV), os.environ.get(SECONDS_ENV)
    try:
        out = (int(every) if every else COMMIT_EVERY, float(seconds) if seconds else COMMIT_SECONDS)
    except ValueError:
        out = (0, 0.0)
    if out[0] < 1 or not out[1] > 0:
        raise SrtError(f"${EVERY_ENV} must be a whole number >= 1 and ${SECONDS_ENV} a number > 0 "
                       f"(got {every!r}, {seconds!r})")
    return out


def open_link(path: str | None, writer: bool) -> Any:
    """The store at `path` (created if needed) as a `StoreLink`, or None; a bad cache is one
    SrtError line."""
    if path is None:
        return None
    from srtcli.store_link import StoreLink

    return StoreLink.open(path, writer)
