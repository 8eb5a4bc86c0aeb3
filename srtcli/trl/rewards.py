"""srt's rewards as TRL reward functions: `GRPOTrainer(reward_funcs=[trl_reward("math_answer")])`.

TRL calls a reward function as `f(prompts, completions, **columns)`: the batch's prompts, its
completions (strings, or chat messages whose last one is the model's), and every other dataset
column as a list. srt's reward functions (`srtcli.rollout.rewards`: the built-ins or
`MODULE:FUNCTION`) score one completion against its prompt record; `trl_reward` turns one into
the other, each row's columns forming its record (so `answer` must be a column for
`math_answer` and `exact_match`), and checks the columns its `needs` names on the first call.
"""

from __future__ import annotations

from typing import Any, Callable

from srtcli.errors import SrtError
from srtcli.rollout.rewards import load_reward, needed_fields


def trl_reward(spec: str) -> Callable[..., list[float]]:
    """A TRL reward function scoring with srt's reward `spec` (a built-in name or MODULE:FUNCTION)."""
    fn = load_reward(spec)
    needs = needed_fields(fn)

    def reward(prompts: list, completions: list, **columns: Any) -> list[float]:
        missing = [f for f in needs if f not in columns]
        if missing:
            raise SrtError(f"reward {spec} needs the dataset column(s) {', '.join(missing)}")
        records = [{k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                   for i in range(len(completions))]
        return [fn(rec, completion_text(c)) for rec, c in zip(records, completions)]

    reward.__name__ = spec.replace(":", "_").replace("/", "_").replace(".", "_")
    return reward


def completion_text(completion: Any) -> str:
    """A completion's text: the string itself, or the content of its last chat message."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion
