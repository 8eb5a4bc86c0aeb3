"""A sampled draft is verified exactly only if the distributions it reports are the ones its
tokens were drawn from: at each position, given the tokens drawn before it, one fixed
distribution (the stop taking what it leaves), and the tokens drawn with those frequencies.
The verifier is exact for any such proposal (test_verify, test_engine_sampling), so this is
what the srt drafter itself must keep.

The rows are live rows of a real engine run on a tiny model, many prompt groups with the same
prompt, so each group's own tree is sparse while the run-wide tree is rich: where the prompt's
tree leads, the run-wide tree's children fill the mass it leaves; an older policy wrote the
trees first, so p-hat is not the sampling policy's p. Each row's state is drafted
from thousands of times (the drafter's random generator swapped for the redraws) and checked
position by position. Leaving those filled children out of the reported distributions (a
deliberately wrong variant) is caught; the end-to-end chi-square on whole outputs barely sees
that bias on a model this small."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

from srtcli.rollout.drafters.base import Proposal
from cache_store.suffix_tree import best_draft
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from tests.srtcli.rollout.engine.support import tiny_model
from tests.srtcli.rollout.engine.test_verify import p_value

V, NEW, BUDGET, REDRAWS = 5, 6, 4, 3000
STOP = -1


class Probe(SrtDrafter):
    """The srt drafter (`min_prob` 0.3: fewer children listed, so more is left to fill and to
    the stop) that, at every `every`-th proposal of a row with output, drafts REDRAWS times
    from the row's state with a generator of its own (the run's draws untouched), and keeps
    those drafts. With `wrong`, children
    the leading tree does not list are left out of every distribution where they were not
    drawn."""

    def __init__(self, stop: bool = True, wrong: bool = False):
        super().__init__(mode="sample", min_prob=0.3, stop=stop)
        self.wrong, self.calls, self.every, self.states = wrong, 0, 0, []

    def propose(self, seq, budget):
        self.calls += 1
        if seq.output and self.every and self.calls % self.every == 0:
            own, self.rng = self.rng, random.Random(self.calls)
            self.states.append(([self.draw(seq, budget) for _ in range(REDRAWS)], self.filled(seq, budget)))
            self.rng = own
        return self.draw(seq, budget)

    def draw(self, seq, budget) -> Proposal:
        prop = super().propose(seq, budget)
        if not self.wrong or not prop.dists:
            return prop
        listed = self.leader(seq, budget, prop.tokens)
        dists = [{t: q for t, q in d.items() if t in listed[i] or (i < len(prop.tokens) and t == prop.tokens[i])}
                 if listed[i] else d for i, d in enumerate(prop.dists)]
        return Proposal(prop.tokens, prop.q, dists)

    def leader(self, seq, budget, tokens) -> list[set[int]]:
        """At each position of a draft along `tokens` (and one past them), the children the
        leading tree's draft tree lists there, while the draft stays on that tree's path
        (empty after it left)."""
        lead, _ = best_draft(seq.drafter_state, budget, self.min_prob)
        tree = lead.draft_tree(budget=4 * budget, min_prob=self.min_prob)
        node, listed = -1, []
        for i in range(len(tokens) + 1):
            kids = {tree.tokens[c]: c for c, par in enumerate(tree.parents) if par == node} if node is not None else {}
            listed.append(set(kids))
            node = kids.get(tokens[i]) if i < len(tokens) else None
        return listed

    def filled(self, seq, budget) -> bool:
        """Whether the row's first drafted position offers a child its leading tree lacks."""
        first = super().propose(seq, budget)
        listed = self.leader(seq, budget, first.tokens)[0]
        return bool(first.dists) and bool(listed) and not set(first.dists[0]) <= listed


def probe(drafter: Probe) -> Probe:
    """A real run: 300 samples of one prompt in 150 groups from an older, peakier policy, then
    600 from the policy, 32 slots, probing every 40th proposal. The trees keep the older
    policy's probabilities (p-hat no longer p), so the fill can offer more than the leading
    tree leaves (and is scaled down)."""
    for policy, sharp, samples, every in ((4, 8.0, 300, 0), (3, 2.0, 600, 40)):
        model = tiny_model("qwen2", vocab=V, sharp=sharp, seed=policy)
        eng = Engine(model, SamplingParams(1.0), drafter, slots=32, budget=BUDGET, max_len=32, seed=policy,
                     draft_length="adaptive")
        drafter.calls, drafter.every = 0, every
        todo = [Sequence([1, 2, 3], max_new_tokens=NEW, group=f"g{i % 150}") for i in range(samples)]
        while todo or eng.active():
            while todo and eng.free_slots():
                eng.admit(todo.pop())
            eng.step()
    return drafter


def dishonest_positions(draws: list[Proposal]) -> list[str]:
    """Every (position, tokens before it) with 200 or more draws reaching it whose reported
    distributions differ, whose q is not its distribution's, or whose draws (a token, or the
    stop: what the distribution leaves) do not fit it (chi-square p < 1e-6)."""
    reached = defaultdict(list)
    for d in draws:
        for i, dist in enumerate(d.dists or []):
            reached[i, tuple(d.tokens[:i])].append((dist, d.tokens[i] if i < len(d.tokens) else STOP,
                                                    d.q[i] if i < len(d.tokens) else None))
    bad = []
    for (i, before), seen in reached.items():
        dist = seen[0][0]
        if any(other != dist for other, _, _ in seen) or any(q is not None and q != dist.get(t) for _, t, q in seen):
            bad.append(f"position {i} after {before}: distributions or q differ between draws")
        elif len(seen) >= 200:
            cells = sorted(dist) + [STOP]
            probs = [dist[t] for t in cells[:-1]] + [max(0.0, 1.0 - sum(dist.values()))]
            counts = [sum(t == c for _, t, _ in seen) for c in cells]
            p = p_value(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64))
            if p < 1e-6:
                bad.append(f"position {i} after {before}: draws {counts} against {probs} (p {p:.2g})")
    return bad


@pytest.fixture(scope="module")
def stop_run() -> Probe:
    return probe(Probe())


def test_the_probed_rows_exercise_the_fill_and_the_stop(stop_run):
    assert len(stop_run.states) >= 20
    assert sum(filled for _, filled in stop_run.states) >= 5
    assert any(d.stopped for draws, _ in stop_run.states for d in draws)


def test_every_sampled_draft_reports_the_distributions_it_was_drawn_from(stop_run):
    bad = [b for draws, _ in stop_run.states for b in dishonest_positions(draws)]
    assert not bad, bad[:5]


def test_drafts_by_counts_without_the_stop_are_honest_too():
    run = probe(Probe(stop=False))
    assert len(run.states) >= 20
    assert not [b for draws, _ in run.states for b in dishonest_positions(draws)]


def test_leaving_the_filled_children_out_of_the_distributions_is_caught():
    run = probe(Probe(wrong=True))
    bad = [b for draws, filled in run.states if filled for b in dishonest_positions(draws)]
    assert len(bad) >= 5
