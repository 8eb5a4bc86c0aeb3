"""The summary of a rollout run: the keys every engine reports, computed once from its counts.

An engine reports `Counts` and its own keys; the shared keys come first, in the order
docs/rollout.md lists them, then the engine's, then the mean reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srtcli.store_link import shown
from srtcli.rollout.config import RolloutConfig

# the summary keys docs/rollout.md promises (the JSON has these and a few more)
SUMMARY_KEYS = ("generated_tokens", "wall_s", "tokens_per_s", "target_forwards", "accepted_per_forward",
                "draft_acceptance_rate", "run_ahead_tokens", "cache_hit_rate")


@dataclass(frozen=True)
class Counts:
    """What an engine counted over the real (not run-ahead) samples of a run."""

    generated: int  # tokens generated
    forwards: int | None  # target-model forwards (None when the engine does not know)
    rows: float  # (sequence, forward) pairs: what accepted_per_forward divides by
    drafted: float  # draft tokens proposed
    accepted: float  # draft tokens accepted
    run_ahead_tokens: int
    hit_rate: float | None  # share of groups that found a tree in the cache (None: no cache)


@dataclass(frozen=True)
class Run:
    """What the driver measured of a run."""

    wall: float  # seconds
    cpu: float  # process CPU seconds
    rewards: list[float]  # one per trajectory written by this run
    prompts: int  # in the file
    skipped: int  # groups a resumed pool already held


def summary(config: RolloutConfig, run: Run, counts: Counts, out: Any, engine_keys: dict) -> dict[str, Any]:
    """The summary of a run (`out` is the pool file)."""
    c = counts
    return {
        "generated_tokens": c.generated,
        "wall_s": round(run.wall, 3),
        "tokens_per_s": round(c.generated / run.wall, 1) if run.wall > 0 else 0.0,
        "target_forwards": c.forwards,
        # null, not 0, when nothing was verified (every group was already in a resumed pool)
        "accepted_per_forward": round(c.generated / c.rows, 4) if c.rows else None,
        "draft_acceptance_rate": round(c.accepted / c.drafted, 4) if c.drafted else 0.0,
        "run_ahead_tokens": c.run_ahead_tokens,
        "cache_hit_rate": round(c.hit_rate, 4) if c.hit_rate is not None else None,
        "drafted_tokens": int(c.drafted),
        "accepted_draft_tokens": int(c.accepted),
        "prompts": run.prompts,
        "groups_skipped": run.skipped,
        "samples_per_prompt": config.k,
        "draft": config.draft,
        "pool": str(out),
        **engine_keys,
        "reward_mean": reward_mean(run.rewards),
    }


def reward_mean(rewards: list[float]) -> float | None:
    """The mean reward of the trajectories written (None when none were)."""
    return round(sum(rewards) / len(rewards), 4) if rewards else None


def canonical_keys(summary: dict, config: RolloutConfig) -> dict[str, Any]:
    """The --json keys every command shares: `out` (what it wrote: here the pool file, also
    `pool`) and `cache` (the tree cache it drafted from; null when it used none)."""
    return {"out": summary["pool"], "cache": shown(config.cache_opt) if config.uses_cache else None}
