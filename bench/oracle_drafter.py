"""The ceiling of bench/rollout_bench.py: a drafter whose every draft is accepted.

Greedy decoding is deterministic, so a plain greedy run (this drafter in `record` mode drafts
nothing and notes every token appended to each sequence, generated or tool output) tells
what every later greedy run of the same prompts will produce; in `replay` mode it drafts
exactly that: the next tokens of the recorded trajectory of the sequence's prompt. Every
draft is then accepted (up to where a tool call ends the model's turn), so its model time as
a ratio to the plain run's is the best any drafter could do with the same draft lengths on
this device: the compute-bound ceiling, where every verified position costs compute. Bench
only: it needs the answer before it is generated.

Every bench/rollout_bench.py run that includes `srt` ends by measuring it (`--no-ceiling` skips
it), e.g. `.venv/bin/python bench/rollout_bench.py --configs none,srt`.
"""

from __future__ import annotations

from typing import Any

from srtcli.rollout.drafters.base import Drafter, Proposal


class OracleDrafter(Drafter):
    name = "oracle"

    def __init__(self) -> None:
        self.trajectories: dict[tuple, list[int]] = {}  # prompt ids -> every token after them
        self.replay = False

    def begin(self, seq: Any) -> None:
        seq.drafter_state = list(seq.tokens[len(seq.prompt_ids):])  # what this sequence appended so far

    def propose(self, seq: Any, budget: int) -> Proposal:
        if not self.replay:
            return Proposal([])
        done = len(seq.tokens) - len(seq.prompt_ids)
        return Proposal(self.trajectories.get(tuple(seq.prompt_ids), [])[done:done + budget])

    def extend(self, seq: Any, tokens: list[int]) -> None:
        seq.drafter_state += tokens

    def end(self, seq: Any) -> None:
        if not self.replay:  # greedy: every sample of a prompt appends the same tokens
            self.trajectories.setdefault(tuple(seq.prompt_ids), seq.drafter_state)
        seq.drafter_state = None
