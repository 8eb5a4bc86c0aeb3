"""The stop rules the engine applies to a row's emitted tokens, and the turn handling at a
tool stop.

A row keeps its emitted tokens up to the first eos ("stop"), or up to where the caller's
`stop_fn` ends the model's turn ("tool"), and never past its `max_new_tokens` or the engine's
`max_len` ("length"). At a tool stop the caller's `turn_end` may give tool output to inject
(untrained tokens, mask 0): the sequence then continues with a new turn, if the output fits.
Output that is not ready yet (`Pending`) is kept on the sequence; the engine appends it with
`add_tool_output` when it is.
"""

from __future__ import annotations

from typing import Any

from srtcli.rollout.engine.sequence import Sequence, StopFn, TurnEndFn

WAIT_S = 0.02  # longest sleep while every row waits for a tool (a call's time limit may fall due)


def cut_emitted(seq: Sequence, emitted: list[int], eos_ids: set[int], stop_fn: StopFn | None,
                max_len: int) -> tuple[int, str | None]:
    """How many of the emitted tokens the sequence keeps, and why it stops there ("stop",
    "tool", "length"; None: it goes on)."""
    cut, reason = len(emitted), None
    for i, t in enumerate(emitted):
        if t in eos_ids:
            cut, reason = i + 1, "stop"
            break
    if stop_fn is not None:
        c = stop_fn(seq, emitted[:cut])
        if c is not None:
            cut, reason = c, "tool"
    left = min(seq.max_new_tokens - seq.generated, max_len - len(seq.tokens))
    if cut > left or (cut == left and reason is None):
        cut, reason = left, "length"
    return cut, reason


def append_generated(seq: Sequence, emitted: list[int], logprobs: list[float], cut: int) -> None:
    """Append the first `cut` emitted tokens as generated (trained, mask 1) with their log-probs."""
    seq.tokens += emitted[:cut]
    seq.logprobs += logprobs[:cut]
    seq.mask += [1] * cut
    seq.generated += cut


def end_turn(seq: Sequence, reason: str, turn_end: TurnEndFn | None, max_len: int, drafter: Any) -> str | None:
    """Close the model's turn; at a tool stop inject `turn_end`'s output (told to `drafter`)
    and return None if the sequence goes on (now, or once its pending output is ready), else
    the finish reason."""
    seq.turns.append((seq.turn_start, len(seq.tokens)))
    if reason != "tool":
        return reason
    if turn_end is None:
        return "stop"
    inject = turn_end(seq)
    if isinstance(inject, str):
        return inject
    if inject is not None and hasattr(inject, "poll"):
        seq.pending = inject
        return None
    return add_tool_output(seq, inject, max_len, drafter)


def add_tool_output(seq: Sequence, inject: list[int] | None, max_len: int, drafter: Any) -> str | None:
    """Append tool output (untrained) and open the next turn; the finish reason if it cannot."""
    room = max_len - len(seq.tokens) - 1
    if inject and len(inject) <= room and seq.generated < seq.max_new_tokens:
        seq.tokens += inject
        seq.logprobs += [0.0] * len(inject)
        seq.mask += [0] * len(inject)
        seq.turn_start = len(seq.tokens)
        if drafter is not None:  # vLLM's proposer reads the tool output from the next turn's row
            drafter.extend(seq, inject)
        return None
    return "length" if inject else "stop"


def take_tool_output(seq: Sequence, max_len: int, drafter: Any) -> tuple[bool, str | None]:
    """A sequence waiting for tool output: (whether it is ready, and then the finish reason it
    gives, or None once it is appended and the next turn is open)."""
    out = seq.pending.poll()
    if out is None:
        return False, None
    seq.pending = None
    return True, out if isinstance(out, str) else add_tool_output(seq, out, max_len, drafter)
