"""The drafter interface every drafter implements, and the `Proposal` a drafter returns.

The engine calls `begin(seq)` when a sequence takes a slot, `propose(seq, budget)` before every
forward, `extend(seq, tokens)` with every token appended to the sequence (generated or tool
output), and `end(seq)` when it leaves its slot. The rollout calls `group_done(uid)` when all
samples of a prompt are finished, `flush()` at the end of each rollout batch (persist what is
pending) and `close()` at the end.

A `Proposal` with `q=None` is deterministic (verified as a point mass); one with `q` set was
*sampled* from the distributions in `dists` (verified with the ratio rule,
`srtcli.rollout.engine.verify`). One with `parents` set is a tree of deterministic candidates
(`srtcli.rollout.engine.tree_verify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Proposal:
    """Draft tokens for one sequence; `q`/`dists` only when they were sampled; `parents` only
    for a tree (node i's parent, -1 for the root's children; parents before children)."""

    tokens: list[int]
    q: list[float] | None = None
    dists: list[dict[int, float]] | None = None
    parents: list[int] | None = None

    def truncate(self, n: int) -> "Proposal":
        """The first n tokens (for a tree: the first n nodes, still a tree)."""
        if len(self.tokens) <= n:
            return self
        q = None if self.q is None else self.q[:n]
        dists = None if self.dists is None else self.dists[:n]
        parents = None if self.parents is None else self.parents[:n]
        return Proposal(self.tokens[:n], q, dists, parents)


class Drafter:
    """The interface (and the `none` behaviour): never drafts."""

    name = "none"

    def begin(self, seq: Any) -> None:
        pass

    def propose(self, seq: Any, budget: int) -> Proposal:
        return Proposal([])

    def extend(self, seq: Any, tokens: list[int]) -> None:
        pass

    def end(self, seq: Any) -> None:
        pass

    def group_done(self, uid: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}
