"""The drafter interface every drafter implements, and the `Proposal` a drafter returns.

The engine calls `begin(seq)` when a sequence takes a slot, `propose(seq, budget)` before every
forward (or `propose_tree(seq, nodes)` where its batch has room for a tree), `extend(seq,
tokens)` with every token appended to the sequence (generated or tool output), and `end(seq)`
when it leaves its slot. The rollout calls `group_done(uid)` when all
samples of a prompt are finished and `close()` at the end (a drafter over the tree cache hands
it what it still holds; the rollout's driver owns the cache and appends).

A `Proposal` with `q=None` is deterministic (verified as a point mass); one with `q` set was
*sampled* from the distributions in `dists` (verified with the ratio rule,
`srtcli.rollout.engine.verify`). A sampled draft may also have ended by drawing "stop" from a
defective distribution (mass < 1): `dists` then has one entry more than `tokens`, and the
verifier samples the token at that position from the residual. One with `parents` set is a
tree of deterministic candidates (`srtcli.rollout.engine.tree_verify`).
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
    # the drafter's confidence in each position, known before its token was drawn (one more
    # entry for a drawn stop): what the engine's cost rule judges a draft by (`draft_cost`)
    conf: list[float] | None = None

    @property
    def stopped(self) -> bool:
        """A sampled draft that ended by drawing "stop" (its last distribution has no token)."""
        return self.dists is not None and len(self.dists) > len(self.tokens)

    def truncate(self, n: int) -> "Proposal":
        """The first n tokens (for a tree: the first n nodes, still a tree). A cut at n drops
        whatever was drawn at position n, a stop too: a draw kept only when it stopped would
        bias the token there."""
        if len(self.tokens) < n or (len(self.tokens) == n and not self.stopped):
            return self
        q = None if self.q is None else self.q[:n]
        dists = None if self.dists is None else self.dists[:n]
        parents = None if self.parents is None else self.parents[:n]
        conf = None if self.conf is None else self.conf[:n]
        return Proposal(self.tokens[:n], q, dists, parents, conf)


class Drafter:
    """The interface (and the `none` behaviour): never drafts."""

    name = "none"

    def begin(self, seq: Any) -> None:
        pass

    def propose(self, seq: Any, budget: int) -> Proposal:
        return Proposal([])

    def propose_tree(self, seq: Any, nodes: int) -> Proposal | None:
        """A tree of up to `nodes` candidates, asked for where the batch has room for more than a
        chain (the engine's tail trees); None: this drafter drafts chains only."""
        return None

    def extend(self, seq: Any, tokens: list[int]) -> None:
        pass

    def end(self, seq: Any) -> None:
        pass

    def group_done(self, uid: str) -> None:
        pass

    def close(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}
