"""GRPO advantages of a pool's steps, filled in where the pool gives none.

`srt pack` stores them in every shard row and `srt train --steps` computes them the same way, so
a step trains with one advantage whichever path it takes (docs/formats.md, `advantage`).
"""

from __future__ import annotations

import math

from srtcli.pool import StepRecord


def _last_steps(steps: list[StepRecord]) -> dict[tuple[str, str], StepRecord]:
    """(prompt_uid, trajectory_id) -> the trajectory's last step, whose reward is the trajectory's."""
    last: dict[tuple[str, str], StepRecord] = {}
    for s in steps:
        key = (s.prompt_uid, s.trajectory_id)
        if key not in last or s.step >= last[key].step:
            last[key] = s
    return last


def _group_norms(last: dict[tuple[str, str], StepRecord]) -> dict[str, tuple[float, float]]:
    """prompt_uid -> (mean, population std) of its trajectories' rewards."""
    groups: dict[str, list[float]] = {}
    for (uid, _), s in last.items():
        groups.setdefault(uid, []).append(s.reward)
    norm: dict[str, tuple[float, float]] = {}
    for uid, rs in groups.items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs))
        norm[uid] = (mean, std)
    return norm


def grpo_advantages(steps: list[StepRecord]) -> list[float]:
    """Each step's advantage: its own if given, else GRPO's.

    GRPO: a trajectory's reward is the reward of its last step; within a group (same
    `prompt_uid`) advantage = (R - mean) / (std + 1e-6) with the population std over the
    group's trajectories; every step of a trajectory gets its trajectory's value.
    """
    last = _last_steps(steps)
    norm = _group_norms(last)
    out = []
    for s in steps:
        if s.advantage is not None:
            out.append(s.advantage)
            continue
        mean, std = norm[s.prompt_uid]
        out.append((last[(s.prompt_uid, s.trajectory_id)].reward - mean) / (std + 1e-6))
    return out
