"""The `srt` drafter: one token tree per prompt, from the LMDB cache, fed on the fly.

When the first sample of a prompt (group) takes a slot, the group's tree is loaded from the
cache (`CacheStore.load(uid)`, already decayed) or started empty. Every token any sample of the
group appends (generated or tool output) goes into that live tree at once, so later and
concurrent samples of the same prompt draft from it, and into a separate *delta* tree holding
only what this run added; when the group ends, the delta is merged into LMDB
(`commit_many`, batched: every `commit_every` groups, at each rollout batch's end via `flush`,
and on `close`), so concurrent writers add counts instead of overwriting each other.

Each sequence is streamed into the trees starting with the prompt's last token (an anchor), so
a sample can be drafted from its very first token. Run-ahead sequences are ordinary sequences
of a future group: their tokens reach that group's trees and nothing else.

Three exact ways to draft (see srtcli/rollout/engine/verify.py, srtcli/rollout/engine/tree_verify.py):
- `mode="greedy"`: follow the most frequent child (`TokenTree.draft`); a point mass.
- `mode="sample"`: sample each child in proportion to its count among the children the tree
  lists (`TokenTree.draft_tree`), recording q; verified with the ratio rule.
- `mode="tree"`: the best-first draft tree itself (`TokenTree.draft_tree`, `budget` nodes),
  verified as a tree: several candidates per position in one forward.
bench/rollout_bench.py measures both (`srt` = sample, `srt-greedy`); sampling accepted more
tokens per forward on the bundled workload, so it is the default.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from cache_store.trie import TokenTree
from srtcli.rollout.drafters import Drafter, Proposal

DEPTH = 64
MODES = ("greedy", "sample", "tree")
SHARED_DEPTH = 24  # the run-wide tree: SuffixDecoding's global-tree depth
SHARED_MAX_NODES = 1 << 21  # then the run-wide tree drops what was seen once (see `_bound`)


def load_tree(store: Any, uid: str) -> tuple[TokenTree, bool]:
    """The prompt's tree from the cache (decayed), or a new empty one; and whether the cache
    held a non-empty tree for it (a hit)."""
    tree = store.load(uid) if store is not None else None
    hit = tree is not None and tree.mass > 0
    return (tree or TokenTree(max_depth=DEPTH)), hit


@dataclass
class _Group:
    tree: TokenTree
    delta: TokenTree
    hit: bool  # the cache held a tree for the prompt when it was first needed
    counted: bool = False


def expected_length(probs: list[float]) -> float:
    """A draft's expected accepted length if each token's C were its chance: sum of the path
    probabilities of its prefixes. Picks between the prompt's tree and the run-wide one."""
    total, path = 0.0, 1.0
    for c in probs:
        path *= c
        total += path
    return total


def best_draft(tree: TokenTree, shared: TokenTree | None, ctx: list[int], budget: int,
               min_prob: float) -> tuple[TokenTree, Any]:
    """The most frequent path from the prompt's tree, or from the run-wide tree when that one
    expects to be accepted for longer; returns the tree drafted from and its `Draft`. Depends on
    the context and the trees only, so verification stays exact."""
    best = tree.draft(ctx, budget=budget, min_prob=min_prob)
    if shared is not None:
        other = shared.draft(ctx[-SHARED_DEPTH:], budget=budget, min_prob=min_prob)
        if expected_length(other.probs) > expected_length(best.probs):
            return shared, other
    return tree, best


def bound_shared(shared: TokenTree | None) -> None:
    """Keep the run-wide tree's memory bounded on long runs: past SHARED_MAX_NODES nodes,
    halve its counts and drop what falls below 1 (substrings seen once), as the cache's
    decay does."""
    if shared is not None and shared.nodes > SHARED_MAX_NODES:
        shared.scale(0.5, floor=1.0)


class SrtDrafter(Drafter):
    name = "srt"

    def __init__(self, store: Any = None, min_prob: float = 0.1, mode: str = "sample", seed: int = 0,
                 commit_every: int = 8, shared: bool = True):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.store, self.min_prob, self.mode = store, min_prob, mode
        # every output of this run, all prompts mixed (not persisted): drafts where the prompt's
        # own tree knows less (a cold prompt; text shared across prompts)
        self.shared = TokenTree(max_depth=SHARED_DEPTH) if shared else None
        self.groups: dict[str, _Group] = {}
        self._pending: dict[str, TokenTree] = {}  # finished groups' deltas not yet committed
        self.commit_every = commit_every
        self.rng = random.Random(seed)
        self.loaded = self.hits = 0

    def _group(self, uid: str) -> _Group:
        g = self.groups.get(uid)
        if g is None:
            tree, hit = load_tree(self.store, uid)
            g = self.groups[uid] = _Group(tree, TokenTree(max_depth=DEPTH), hit)
        return g

    def begin(self, seq: Any) -> None:
        g = self._group(seq.group)
        if not seq.runahead and not g.counted:  # the hit rate is over real groups only
            g.counted = True
            self.loaded += 1
            self.hits += g.hit
        streams = (g.tree.stream(), g.delta.stream())
        if self.shared is not None:
            streams += (self.shared.stream(),)
        anchor = [seq.prompt_ids[-1]]
        for s in streams:
            s.extend(anchor)
        # the sequence keeps its group's tree: a run-ahead sequence may outlive the group
        seq.drafter_state = (g.tree, streams)

    def propose(self, seq: Any, budget: int) -> Proposal:
        tree = seq.drafter_state[0]
        ctx = ([seq.prompt_ids[-1]] + seq.output)[-DEPTH:]
        tree, best = best_draft(tree, self.shared, ctx, budget, self.min_prob)
        if self.mode == "greedy":
            return Proposal(best.tokens)
        if self.mode == "tree":
            dt = tree.draft_tree(ctx[-tree.max_depth:], budget=budget, min_prob=self.min_prob)
            return Proposal(dt.tokens, parents=dt.parents)
        return self._sample(tree, ctx[-tree.max_depth:], budget)

    def _sample(self, tree: TokenTree, ctx: list[int], budget: int) -> Proposal:
        dt = tree.draft_tree(ctx, budget=4 * budget, min_prob=self.min_prob)
        kids: dict[int, list[int]] = {}
        for i, par in enumerate(dt.parents):
            kids.setdefault(par, []).append(i)
        toks, qs, dists, node = [], [], [], -1
        while len(toks) < budget and node in kids:
            idx = kids[node]
            total = sum(dt.probs[i] for i in idx)
            dist = {dt.tokens[i]: dt.probs[i] / total for i in idx}
            node = self.rng.choices(idx, weights=[dt.probs[i] for i in idx])[0]
            toks.append(dt.tokens[node])
            qs.append(dist[dt.tokens[node]])
            dists.append(dist)
        return Proposal(toks, qs, dists) if toks else Proposal([])

    def extend(self, seq: Any, tokens: list[int]) -> None:
        for s in seq.drafter_state[1]:
            s.extend(tokens)

    def end(self, seq: Any) -> None:
        seq.drafter_state = None

    def group_done(self, uid: str) -> None:
        bound_shared(self.shared)
        g = self.groups.pop(uid, None)
        if g is not None and g.delta.mass > 0:
            self._pending[uid] = g.delta
            if len(self._pending) >= self.commit_every:
                self.flush()

    def flush(self) -> None:
        """Merge the deltas of finished groups into LMDB in one transaction."""
        if self.store is not None and self._pending:
            self.store.commit_many(self._pending)
        self._pending = {}

    def close(self) -> None:
        """Commit what is still held (e.g. run-ahead trees of prompts not reached)."""
        self._pending.update({u: g.delta for u, g in self.groups.items() if g.delta.mass > 0})
        self.flush()
        self.groups.clear()

    def stats(self) -> dict[str, float]:
        return {"cache_groups": self.loaded, "cache_hits": self.hits,
                "cache_hit_rate": self.hits / self.loaded if self.loaded else 0.0}
