"""What the engine generates and counts: a `Sequence` (one trajectory in a slot), the engine's
`EngineStats`, and the signatures of the caller's stop and turn-end hooks (and `Pending`, the
tool output a turn-end hook may hand back before it is ready).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass
class Sequence:
    """One trajectory being generated (a sample of a prompt, or a run-ahead continuation)."""

    prompt_ids: list[int]
    max_new_tokens: int
    group: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    runahead: bool = False
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn
    turn_start: int = 0
    cache_len: int = 0
    generated: int = 0
    finish_reason: str | None = None
    slot: int = -1
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    spec_len: int = -1  # adaptive draft length (engine-managed; -1 = not started)
    drafter_state: Any = None
    pending: Any = None  # tool output still being computed (`Pending`): the row sits out until ready

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)
            self.logprobs = [0.0] * len(self.tokens)
            self.mask = [0] * len(self.tokens)
        self.turn_start = len(self.tokens)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]


@dataclass
class EngineStats:
    """Counters over real (not run-ahead) rows unless named otherwise."""

    forwards: int = 0  # model forward calls that carried at least one real row
    all_forwards: int = 0
    row_forwards: int = 0  # (sequence, forward) pairs
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    runahead_tokens: int = 0
    model_s: float = 0.0  # wall seconds inside the model's forward (CUDA: synchronised)

    def record(self, seq: Sequence, drafted: int, accepted: int, kept: int) -> None:
        """Count one row's verified draft in the sequence and here (run-ahead rows only as
        run-ahead tokens)."""
        if seq.runahead:
            self.runahead_tokens += kept
            return
        seq.forwards += 1
        seq.drafted += drafted
        seq.accepted += min(accepted, drafted)
        self.row_forwards += 1
        self.emitted += kept
        self.drafted += drafted
        self.accepted += min(accepted, drafted)


class Pending(Protocol):
    """Tool output that is still being computed; the engine polls it before each step."""

    def poll(self) -> "list[int] | str | None":
        """The tokens to append (or a finish reason) once ready, else None."""

    def wait(self, seconds: float) -> None:
        """Block until some pending output may be ready, at most `seconds`."""


StopFn = Callable[[Sequence, list[int]], "int | None"]
# what follows a tool stop: tokens to append, a finish reason, output still pending, or None (stop)
TurnEndFn = Callable[[Sequence], "list[int] | str | Pending | None"]
