"""Time in a cache: the logical clock, recency decay, and durations.

The logical clock is a tick counter in the store's header (LMDB's `info` sub-database, a
server's clock key); `srt rollout` advances it once per rollout batch (`SequenceStore.tick`). Weights decay with age
measured in ticks: a sequence written at tick `s` with weight `w` weighs
`w * 0.5 ** ((now - s) / half_life)` at tick `now`. Decay is lazy: a record keeps the tick it
was written at and is decayed only when it is read, so prompts nobody touches cost nothing.
A sequence whose decayed weight falls below the floor is left out of loads and pruned.

Defaults (settable when a cache is created; docs/cache.md explains the choice): a half-life
of 100 ticks and a floor of 0.1, so a path seen once and never again disappears after
about 332 ticks (log2(1/0.1) = 3.32 half-lives), while a prompt revisited every epoch keeps
its recent rollouts at full weight.
"""

from __future__ import annotations

import math
import re

DEFAULT_HALF_LIFE = 100.0
DEFAULT_FLOOR = 0.1

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def decay_factor(now: int, stamp: int, half_life: float) -> float:
    """The factor that brings counts stamped at tick `stamp` to tick `now` (1.0 if not older)."""
    if now <= stamp or math.isinf(half_life):
        return 1.0
    return 0.5 ** ((now - stamp) / half_life)


def check_settings(half_life: float, floor: float) -> None:
    """Raise ValueError for settings a cache cannot use."""
    if not (half_life > 0) or math.isnan(half_life):
        raise ValueError(f"half-life must be a positive number of ticks (or inf), got {half_life}")
    if not (floor >= 0) or math.isinf(floor):
        raise ValueError(f"floor must be a finite number >= 0, got {floor}")


def parse_duration(text: str) -> float:
    """Seconds in a duration like 30s, 10m, 12h, 7d, 2w; raises ValueError."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"bad duration {text!r} (use a number and a unit: 30s, 10m, 12h, 7d, 2w)")
    return float(m.group(1)) * _UNITS[m.group(2)]


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in a size like 1000, 64K, 512M, 2G (binary units); raises ValueError."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r} (use bytes or a unit: 512K, 64M, 2G)")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _SIZE_UNITS[unit]
