"""The reference the srt drafters are checked against: a draft looked up from an explicit
context (the sequence's last tokens, anchor first) in the prompt's tree and the run-wide tree,
the way the drafting rules define it, instead of read off the sequence's own streams."""

from __future__ import annotations

from cache_store.store import TREE_DEPTH
from srtcli.rollout.drafters.prompt_trees import SHARED_DEPTH
from tests.cache_store.reference_tree import expected_length


def context_draft(tree, shared, ctx: list[int], budget: int, min_prob: float) -> list[int]:
    """The prompt tree's draft after `ctx`, or the run-wide tree's if that one expects to be
    accepted for longer."""
    best = tree.draft(ctx[-TREE_DEPTH:], budget=budget, min_prob=min_prob)
    if shared is not None:
        other = shared.draft(ctx[-SHARED_DEPTH:], budget=budget, min_prob=min_prob)
        if expected_length(other.probs) > expected_length(best.probs):
            best = other
    return best.tokens
