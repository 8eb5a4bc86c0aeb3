"""The `suffix` drafter: SuffixDecoding as vLLM configures it (depth 24, spec factor 1.0,
min token prob 0.1), the baseline the srt drafter is measured against.

One global SuffixTree over every output generated so far (each sequence a live stream fed on
the fly, all prompts mixed) and one tree per prompt group holding its prompt. Each proposes the
most frequent path from the longest match of the sequence's tail, capped at `spec_factor x
match_len` tokens; the longer draft wins (ties go to the higher path score). Deterministic:
verified as point masses.
"""

from __future__ import annotations

import math
from typing import Any

from cache_store.suffix_tree import SuffixTree
from srtcli.rollout.drafters.base import Drafter, Proposal


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(self, depth: int = 24, spec_factor: float = 1.0, min_prob: float = 0.1):
        self.depth, self.spec_factor, self.min_prob = depth, spec_factor, min_prob
        self.global_tree = SuffixTree(max_depth=depth)
        self._prompt_trees: dict[str, SuffixTree] = {}  # per prompt group, dropped when it ends

    def begin(self, seq: Any) -> None:
        key = seq.group
        tree = self._prompt_trees.get(key)
        if tree is None:
            tree = self._prompt_trees[key] = SuffixTree(max_depth=self.depth)
            tree.add(seq.prompt_ids)
        seq.drafter_state = (self.global_tree.stream(), tree)

    def propose(self, seq: Any, budget: int) -> Proposal:
        ctx = seq.tokens[-self.depth:]
        best: tuple[int, float, list[int]] = (0, 0.0, [])
        for tree in (self.global_tree, seq.drafter_state[1]):
            d = tree.draft(ctx, budget=budget, min_prob=self.min_prob)
            cap = math.floor(d.match_len * self.spec_factor)
            toks = d.tokens[:cap]
            score = math.prod(d.probs[: len(toks)]) if toks else 0.0
            if (len(toks), score) > best[:2]:
                best = (len(toks), score, toks)
        return Proposal(best[2])

    def extend(self, seq: Any, tokens: list[int]) -> None:
        seq.drafter_state[0].extend(tokens)

    def end(self, seq: Any) -> None:
        seq.drafter_state = None  # the stream, now garbage, closes

    def group_done(self, uid: str) -> None:
        self._prompt_trees.pop(uid, None)
