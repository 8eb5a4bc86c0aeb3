"""The `srt` drafter: one suffix tree per prompt, from the tree cache, fed on the fly.

The drafter calls only the run's tree session (`srtcli.rollout.tree_session.TreeSession`, whose
owner opens, ends the batches of and closes it; the vLLM proposer uses the same one): the
prompt's tree is built from its stored rollouts when the first sample of its group takes a slot
(the group is held until it is done), every token any sample appends feeds it at once, and the
sequences this run generated are stored with their group. Run-ahead sequences are ordinary
sequences of a future group: their tokens reach that group's trees (and the store, as sequences
of that prompt) and nothing else.

Three exact ways to draft (see `srtcli.rollout.engine.verify`, `srtcli.rollout.engine.tree_verify`):
- `mode="greedy"`: follow the most frequent child (`best_draft`); a point mass.
- `mode="sample"`: sample each child in proportion to its count among the children the tree
  lists (`SuffixTree.draft_tree`), recording q; verified with the ratio rule. One compiled
  call (`cache_store.suffix_tree.sample_draft`) picks the stream (`pick_stream`) and walks.
  With `stop` (the default), where the tree knows the policy's probability of every child
  (p-hat, recorded with each token it stores), children are drawn by p-hat instead and the
  mass left over ends the draft: a draft stops where it would likely have been rejected, so
  fewer verified tokens are wasted (the verifier then samples the next token from the
  residual, which keeps the output distribution exact). The other stream's tree offers its
  own children for that leftover mass first (followed along the same tokens), so a draft
  stops only where neither tree lists what the policy may say.
- `mode="tree"`: the best-first draft trees of both streams merged by path score
  (`merged_draft`, `budget` nodes), verified as a tree: several candidates per position in one
  forward.
bench/rollout_bench.py measures both (`srt` = sample, `srt-greedy`); sampling accepted more
tokens per forward on the bundled workload, so it is the default.
"""

from __future__ import annotations

import math
import random
from operator import mul
from typing import Any

from cache_store.suffix_tree import best_draft, merged_draft, sample_draft
from srtcli.rollout.drafters.base import Drafter, Proposal
from srtcli.rollout.tree_session import TreeSession

MODES = ("greedy", "sample", "tree")


def concentration(dist: dict[int, float]) -> float:
    """The confidence of a position drawn from `dist` ({token: q}), known before the draw: the
    chance that two draws of its tokens agree, sum q^2 / sum q (1 for a single child)."""
    q = dist.values()
    total = sum(q)
    return sum(map(mul, q, q)) / total if total > 0 else 0.0


class SrtDrafter(Drafter):
    name = "srt"

    def __init__(self, session: TreeSession | None = None, min_prob: float = 0.1, mode: str = "sample",
                 seed: int = 0, stop: bool = True, record_probs: bool = True):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.min_prob, self.mode, self.stop = min_prob, mode, stop
        # the sequences' log-probs are the policy's (sampling), not greedy's 0.0: store them
        self.record_probs = record_probs
        # None: trees for this drafter's life only, with the run-wide shared tree (every output
        # of the run, all prompts mixed, not persisted), which drafts where the prompt's own tree
        # knows less: a cold prompt, text shared across prompts
        self.session = session if session is not None else TreeSession()
        self.groups: set[str] = set()  # the groups this drafter holds in the session
        self.rng = random.Random(seed)

    def begin(self, seq: Any) -> None:
        if seq.group not in self.groups:
            self.groups.add(seq.group)
            self.session.hold(seq.group)
        g, streams = self.session.start_sequence(seq.group, seq.prompt_ids[-1])
        if not seq.runahead:  # the hit rate is over real groups only
            self.session.count(g)
        # the sequence keeps its streams (and through them its trees: a run-ahead sequence may
        # outlive its group); they hold everything after the prompt, from the start on
        seq.drafter_state = streams
        self._feed(seq, seq.output)

    def propose(self, seq: Any, budget: int) -> Proposal:
        # the streams hold the sequence's tokens (anchor first): a step costs the same at token
        # 16,000 as at token 16
        if self.mode == "sample":
            toks, qs, dists = sample_draft(seq.drafter_state, budget, self.min_prob, self.rng.random,
                                           self.stop)
            return Proposal(toks, qs, dists, conf=[concentration(d) for d in dists]) if dists else Proposal([])
        if self.mode == "tree":
            return self.propose_tree(seq, budget)
        draft = best_draft(seq.drafter_state, budget, self.min_prob)[1]
        return Proposal(draft.tokens, conf=draft.probs)

    def propose_tree(self, seq: Any, nodes: int) -> Proposal:
        """The best-first draft trees of the row's streams (its prompt's tree and the run-wide
        one) merged into one of `nodes` nodes, the stream `pick_stream` picks first: it wins
        ties, which a chain of only children (C = 1) makes common (`merged_draft`, one
        compiled call; `mode="tree"`, and the engine's tail trees in every mode)."""
        tokens, parents = merged_draft(seq.drafter_state, nodes, self.min_prob)
        return Proposal(tokens, parents=parents)

    def extend(self, seq: Any, tokens: list[int]) -> None:
        self._feed(seq, tokens)

    def _feed(self, seq: Any, tokens: list[int]) -> None:
        """Feed tokens just appended to the sequence to its streams, with the probability the
        policy gave each (0 for tool output, which is never drafted)."""
        n = len(tokens)
        if n == 0:
            return
        probs = None
        if self.record_probs and len(seq.logprobs) == len(seq.tokens) == len(seq.mask) and seq.tokens[-n:] == tokens:
            probs = [math.exp(lp) if m else 0.0 for lp, m in zip(seq.logprobs[-n:], seq.mask[-n:])]
        for s in seq.drafter_state:
            s.extend(tokens, probs)

    def end(self, seq: Any) -> None:
        self.session.stop_sequence(seq.drafter_state[0])
        seq.drafter_state = None

    def group_done(self, uid: str) -> None:
        if uid in self.groups:
            self.groups.discard(uid)
            self.session.release(uid)
            self.session.commit_if_due()

    def stats(self) -> dict[str, float]:
        t = self.session.trees
        return {"cache_groups": t.loaded, "cache_hits": t.hits,
                "cache_hit_rate": t.hits / t.loaded if t.loaded else 0.0}
