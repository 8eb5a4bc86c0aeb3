"""How much of the acceptance its tree allows a drafter's chains get, measured in a rollout.

A chain drafted from a token tree can only be accepted where the policy's token is one of the
children the tree listed at that position, so the policy's probability mass on those children
(their *coverage*) bounds the chance that any proposal over them is accepted there; a sampled
proposal q is accepted with probability sum_x min(p(x), q(x)), which reaches the bound when q
equals p on them (a deterministic draft, a point mass such as ArcticInference's, lists one child
and is accepted with p(x), its own bound). `measure_drafts()` records both at every drafted
position (and the one whose stop ended it) of every chain the embedded engine verifies while it is open (it wraps the engine's
`verify_chains`, where the policy's p and the drafts meet; the engine runs unchanged; tree
drafts are not counted). Where the two agree, more accepted tokens per forward need trees that
list more of the policy's mass (more or better-matched rollouts), not a better proposal. The
first position of a chain is the clean comparison: later ones are reached only along the path
the draft drew and the verifier accepted.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from srtcli.rollout.engine import engine


@dataclass
class DraftCoverage:
    """Sums over the verified chains' drawn positions (the first of each chain apart): the chance
    each was accepted and its coverage; chains (a draft that stopped at once is one) and draft
    tokens accepted."""

    chains: int = 0
    accepted: int = 0
    first: list[float] = field(default_factory=lambda: [0.0, 0.0])  # acceptance, coverage
    later: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # positions, acceptance, coverage

    def add(self, acceptance: list[float], coverage: list[float], accepted: int) -> None:
        """One chain: per position drawn at, the chance of an accepted token and the children's mass."""
        self.chains += 1
        self.accepted += accepted
        self.first[0] += acceptance[0]
        self.first[1] += coverage[0]
        self.later[0] += len(acceptance) - 1
        self.later[1] += sum(acceptance[1:])
        self.later[2] += sum(coverage[1:])

    def summary(self) -> dict[str, float]:
        n, m = max(self.chains, 1), max(self.later[0], 1)
        return {"chains": self.chains, "accepted_per_chain": self.accepted / n,
                "first_acceptance": self.first[0] / n, "first_coverage": self.first[1] / n,
                "later_acceptance": self.later[1] / m, "later_coverage": self.later[2] / m}


def chain_chances(p: torch.Tensor, prop: Any) -> tuple[list[float], list[float]]:
    """For one row's chain (`Proposal`) and its p [K, V]: at each position the draft drew at (a
    token, or the stop that ended it), the chance the ratio rule accepts what is drawn there
    (sum min(p, q); the stop is never accepted) and the policy's mass on the children listed."""
    if prop.q is None:  # point masses: accepted with p(x), all the mass they list
        chances = [float(p[k, tok]) for k, tok in enumerate(prop.tokens)]
        return chances, chances
    acceptance, coverage = [], []
    for k, dist in enumerate(prop.dists or []):
        pk = p[k, list(dist)]
        acceptance.append(float(torch.minimum(pk, torch.tensor(list(dist.values()), dtype=pk.dtype)).sum()))
        coverage.append(float(pk.sum()))
    return acceptance, coverage


@contextmanager
def measure_drafts() -> Iterator[DraftCoverage]:
    """Record every verified chain's acceptance chances and coverage while open."""
    seen = DraftCoverage()
    verify = engine.verify_chains

    def measured(p, props, generator, device):
        out = verify(p, props, generator, device)
        probs = p.detach().float().cpu()
        for r, (prop, accepted) in enumerate(zip(props, out[0])):
            if prop.tokens or prop.dists:
                seen.add(*chain_chances(probs[r], prop), accepted)
        return out

    engine.verify_chains = measured
    try:
        yield seen
    finally:
        engine.verify_chains = verify
