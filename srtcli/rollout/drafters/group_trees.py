"""The token trees one run drafts from and writes back, per prompt group: the one component
behind both the embedded `srt` drafter and the vLLM proposer, so both fill the cache alike.

When a group's prompt is first needed its tree is loaded from the cache (`CacheStore.load`,
already decayed) or started empty, with a flag saying whether the cache held one (a hit). Every
token a sample of the group appends goes at once into that live tree, so later and concurrent
samples draft from it, into a *delta* tree holding only what this run added, and into the
run-wide shared tree (all prompts mixed, never persisted). Each sequence is streamed into them
starting with the prompt's last token (an anchor), so it can be drafted from its first token.
When a group ends its delta waits in `pending` until it is merged into LMDB with one
`commit_many` (batched), so concurrent writers add counts instead of overwriting each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cache_store.trie import TokenTree

DEPTH = 64
SHARED_DEPTH = 24  # the run-wide tree: SuffixDecoding's global-tree depth
SHARED_MAX_NODES = 1 << 21  # then the run-wide tree drops what was seen once (see `bound_shared`)


def load_tree(store: Any, uid: str) -> tuple[TokenTree, bool]:
    """The prompt's tree from the cache (decayed), or a new empty one; and whether the cache
    held a non-empty tree for it (a hit)."""
    tree = store.load(uid) if store is not None else None
    hit = tree is not None and tree.mass > 0
    return (tree or TokenTree(max_depth=DEPTH)), hit


def bound_shared(shared: TokenTree | None) -> None:
    """Keep the run-wide tree's memory bounded on long runs: past SHARED_MAX_NODES nodes,
    halve its counts and drop what falls below 1 (substrings seen once), as the cache's
    decay does."""
    if shared is not None and shared.nodes > SHARED_MAX_NODES:
        shared.scale(0.5, floor=1.0)


@dataclass
class Group:
    """One prompt's trees while the run works on it."""

    tree: TokenTree  # live: the cache's tree plus everything this run added
    delta: TokenTree  # only what this run added (what gets committed)
    hit: bool  # the cache held a tree for the prompt when it was first needed
    counted: bool = False  # counted in `loaded`/`hits`
    finished: int = 0  # samples done (the vLLM proposer ends a group after K)


class GroupTrees:
    """The live groups, the shared tree, the deltas waiting to be committed, and the hit counts.
    `writer=False` drafts and feeds the trees like a writer but never commits (a vLLM rank
    other than 0, so counts are not multiplied)."""

    def __init__(self, store: Any = None, shared: bool = True, commit_every: int = 8, writer: bool = True):
        self.store, self.commit_every, self.writer = store, commit_every, writer
        self.shared = TokenTree(max_depth=SHARED_DEPTH) if shared else None
        self.groups: dict[str, Group] = {}
        self.pending: dict[str, TokenTree] = {}  # finished groups' deltas not yet committed
        self.loaded = self.hits = 0

    def group(self, uid: str) -> Group:
        """The group's trees, loaded from the cache the first time the prompt is needed."""
        g = self.groups.get(uid)
        if g is None:
            tree, hit = load_tree(self.store, uid)
            g = self.groups[uid] = Group(tree, TokenTree(max_depth=DEPTH), hit)
        return g

    def count(self, g: Group) -> None:
        """Count a group (once) in the loaded groups and cache hits."""
        if not g.counted:
            g.counted = True
            self.loaded += 1
            self.hits += g.hit

    def streams(self, g: Group, anchor: int) -> tuple:
        """Streams into the group's live and delta trees and the shared tree, fed `anchor`
        (the prompt's last token) first."""
        streams = (g.tree.stream(), g.delta.stream())
        if self.shared is not None:
            streams += (self.shared.stream(),)
        for s in streams:
            s.extend([anchor])
        return streams

    def retire(self, uid: str) -> None:
        """The group is done: its delta (if it holds anything) waits for the next commit."""
        bound_shared(self.shared)
        g = self.groups.pop(uid, None)
        if g is not None and g.delta.mass > 0:
            self.pending[uid] = g.delta

    def flush_if_due(self) -> bool:
        """Commit once `commit_every` groups' deltas are waiting; True if a commit ran."""
        return bool(self.pending) and len(self.pending) >= self.commit_every and self.flush()

    def flush(self) -> bool:
        """Merge the waiting deltas into LMDB in one transaction; True if a commit ran."""
        committed = self.store is not None and self.writer and bool(self.pending)
        if committed:
            self.store.commit_many(self.pending)
        self.pending = {}
        return committed

    def close(self) -> None:
        """Commit every delta still held, live groups' too (run-ahead trees of prompts not
        reached), and forget the groups."""
        self.pending.update({u: g.delta for u, g in self.groups.items() if g.delta.mass > 0})
        self.flush()
        self.groups.clear()
