"""A finished sample, whichever engine generated it, and the pool steps it becomes.

Each engine turns its own output into a `Sample` (`sample_of` for a trajectory of turns);
`turn_steps` makes one pool step per model turn of it: the sequence up to the end of that turn,
trained (loss mask 1, the sampling log-probs) on the turn's tokens only, so tool results and
earlier turns are context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One finished sample of a prompt."""

    index: int  # which of the prompt's K samples (`meta.sample`)
    tokens: list[int]  # the prompt, then every turn (model and tool tokens)
    logprobs: list[float]  # one per token of `tokens` (0.0 where the model did not sample it)
    turns: list[tuple[int, int]]  # [start, end) of each model turn in `tokens`
    finish_reason: str
    text: str  # the completion, as the reward reads it
    meta: dict[str, Any] = field(default_factory=dict)  # what the engine adds to every step's meta
    reward: float | None = None  # the trajectory's own reward (a tool environment's), if it has one


def turn_steps(uid: str, prompt_id: str, sample: Sample, reward: float, k: int, temperature: float) -> list:
    """One pool step per model turn of a finished sample. `meta.temperature` says whether the
    old_logprobs are the probabilities the tokens were sampled with (> 0) or greedy's 0.0."""
    from srtcli.pool import StepRecord

    out = []
    for i, (s, e) in enumerate(sample.turns):
        last = i == len(sample.turns) - 1
        mask = [0] * s + [1] * (e - s)
        lps = [0.0] * s + sample.logprobs[s:e]
        meta = {"prompt_id": prompt_id, "sample": sample.index,
                "finish_reason": sample.finish_reason if last else "tool", "group_size": k,
                "temperature": temperature}
        if last:
            meta["last"] = True
        meta.update(sample.meta)
        out.append(StepRecord(uid, f"{uid}-{sample.index}", i, sample.tokens[:e], mask, lps, reward, meta=meta))
    return out


def sample_of(seq: Any, tok: Any, reward: float | None = None, meta: dict | None = None) -> Sample:
    """A finished trajectory (`srtcli.rollout.engine.sequence.Sequence`, whichever engine ran its
    turns) as a sample (a turn closed empty is no model turn)."""
    return Sample(seq.meta["sample"], seq.tokens, seq.logprobs, [(s, e) for s, e in seq.turns if e > s],
                  seq.finish_reason, tok.decode(seq.output, skip_special_tokens=False), meta or {}, reward)
