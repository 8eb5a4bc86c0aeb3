"""ArcticInference's SuffixDecoding (`arctic_inference.suffix_decoding.SuffixDecodingCache`, the
implementation behind vLLM's `suffix` method) behind srtcli's `Drafter` interface, as the
outside baseline of bench/rollout_bench.py (config `arctic`). Bench-only: srtcli never imports
arctic_inference.

It is driven the way vLLM's SuffixDecodingProposer drives it: each sequence the engine admits is
a new request (`start_request` with its prompt: the request's own prompt tree), every token
appended to it (generated or tool output) goes to `add_active_response` (the request's tree and
its response in the global tree), `speculate` drafts from the last `max_tree_depth` tokens, and
`stop_request` ends the request while its response stays cached. One object serves every run it
is given to, so the global tree of past responses is kept across epochs, as srt's trees are.

Parameters are vLLM's defaults for `method="suffix"` (vllm/config/speculative.py):
`suffix_decoding_max_tree_depth=24`, `suffix_decoding_max_cached_requests=10000` (FIFO
eviction past that), `suffix_decoding_max_spec_factor=1.0`, `suffix_decoding_min_token_prob=0.1`;
at most the engine's draft length (the bench's `--budget`) per speculation: its own length
rule, as vLLM runs it (bench config `arctic`, the engine's `--draft-length fixed`), or cut by
srt's cost rule (`arctic-cost`), which judges each token by the probability SuffixDecoding gives
it. Drafts are deterministic, verified as point masses; where the engine asks for a tree
(its tail trees) it gets SuffixDecoding's own speculation tree (`use_tree_spec=True`).

Measured against srt by (with the `bench` extra, `pip install -e '.[bench]'`; without it the
bench skips `arctic` with a one-line note):

    .venv/bin/python bench/rollout_bench.py --configs none,srt,arctic
"""

from __future__ import annotations

import importlib
from typing import Any

from srtcli.rollout.drafters.base import Drafter, Proposal


def arctic_available() -> bool:
    """Whether arctic_inference (the optional `bench` extra) is importable."""
    try:
        importlib.import_module("arctic_inference.suffix_decoding")
    except ImportError:
        return False
    return True


class ArcticDrafter(Drafter):
    name = "arctic"

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.depth, self.spec_factor, self.min_prob = max_tree_depth, max_spec_factor, min_token_prob
        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self._requests = 0  # request ids: one per admitted sequence, never reused (a reuse evicts)

    def begin(self, seq: Any) -> None:
        req, self._requests = self._requests, self._requests + 1
        self.cache.start_request(req, seq.prompt_ids)
        if len(seq.tokens) > len(seq.prompt_ids):  # a continuation: what it already has is its response
            self.cache.add_active_response(req, seq.output)
        seq.drafter_state = req

    def propose(self, seq: Any, budget: int) -> Proposal:
        draft = self.cache.speculate(seq.drafter_state, seq.tokens[-self.depth:], max_spec_tokens=budget,
                                     max_spec_factor=self.spec_factor, min_token_prob=self.min_prob)
        return Proposal(list(draft.token_ids), conf=list(draft.probs))

    def propose_tree(self, seq: Any, nodes: int) -> Proposal:
        """Its own speculation tree (`use_tree_spec`), for the engine's tail trees: the same
        verification srt's trees get."""
        draft = self.cache.speculate(seq.drafter_state, seq.tokens[-self.depth:], max_spec_tokens=nodes,
                                     max_spec_factor=self.spec_factor, min_token_prob=self.min_prob,
                                     use_tree_spec=True)
        return Proposal(list(draft.token_ids), parents=list(draft.parents))

    def extend(self, seq: Any, tokens: list[int]) -> None:
        self.cache.add_active_response(seq.drafter_state, tokens)

    def end(self, seq: Any) -> None:
        self.cache.stop_request(seq.drafter_state)
        seq.drafter_state = None

    def stats(self) -> dict[str, float]:
        return {"cached_responses": float(len(self.cache.cached_requests))}
