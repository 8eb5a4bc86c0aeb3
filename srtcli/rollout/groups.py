"""Finished sequences gathered into their prompt's group: every rollout path (the embedded
engine, vLLM's turn loop, the TRL rollout function) hands a group on only once all of its
samples are in, since rewards, advantages and the tree session's group commit are per group."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class GroupCollector:
    """Sequences by group (`seq.group`) until the group has `sizes` of them (one size for every
    group, or one per group)."""

    def __init__(self, sizes: int | Mapping[str, int]):
        self.sizes = sizes
        self.waiting: dict[str, list] = {}

    def add(self, seq: Any) -> list | None:
        """The group's sequences in sample order (`meta["sample"]`, else as they finished) once
        `seq` completes it, else None."""
        group = self.waiting.setdefault(seq.group, [])
        group.append(seq)
        size = self.sizes if isinstance(self.sizes, int) else self.sizes[seq.group]
        if len(group) < size:
            return None
        del self.waiting[seq.group]
        return sorted(group, key=lambda s: s.meta.get("sample", 0))
