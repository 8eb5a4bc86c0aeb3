"""Scheduling rollout batches on the engine, with run-ahead in the long tail.

A rollout is a list of *rollout batches* (the prompts of one synchronous RL step, each with K
samples). Within a batch, free slots are refilled from the batch's queue (continuous
batching); the batch ends when its last sample finishes (the barrier synchronous RL imposes).

Run-ahead: once a batch's queue is empty, its slots free up one by one while the long tail
finishes. Idle slots then generate partial continuations (`tokens` each) for the prompts of
the *next* batch (after the last batch: the first prompts of the file, which the next epoch
starts with), under the current model. Those sequences are ordinary engine sequences flagged
`runahead`: the drafter feeds their tokens into their prompts' trees, the engine counts them
apart, and they never reach the pool. When the batch's real work is done they are dropped at
once, so the barrier is never extended; the only cost is the extra rows in the tail's forwards
(measured in bench/rollout_bench.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sequence import Sequence


@dataclass
class RunAhead:
    """Run-ahead settings: on/off, prompts looked ahead, tokens per continuation."""

    enabled: bool = True
    window: int = 16
    tokens: int = 32


@dataclass
class Upcoming:
    """A prompt a later batch will roll out: its group uid and prompt ids."""

    uid: str
    prompt_ids: list[int]


def run_batches(engine: Engine, batches: list[list[Sequence]], upcoming: list[list[Upcoming]],
                runahead: RunAhead) -> Iterator[Sequence | int]:
    """Roll out `batches` in order; `upcoming[b]` are the prompts to run ahead for during b.
    Yields each sequence of a batch as it finishes, then the batch's index once it is over
    (its run-ahead work dropped)."""
    for b, batch in enumerate(batches):
        queue = deque(batch)
        ahead = deque(
            Sequence(u.prompt_ids, max_new_tokens=runahead.tokens, group=u.uid, runahead=True)
            for u in (upcoming[b][: runahead.window] if runahead.enabled else [])
        )
        while queue or any(not s.runahead for s in engine.active()):
            while queue and engine.free_slots():
                engine.admit(queue.popleft())
            if not queue:
                while ahead and engine.free_slots():
                    engine.admit(ahead.popleft())
            for seq in engine.step():
                if not seq.runahead:
                    yield seq
        for seq in engine.active():  # only run-ahead work can be left: drop it now
            engine.drop(seq)
        yield b
