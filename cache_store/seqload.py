"""A load: which of a prompt's stored sequences its tree is built from, and the build.

A build costs about a microsecond per token (more once the tree outgrows the CPU caches) and
runs inside the engine step that first needs the prompt, and a live tree holds ~100 bytes per
token, so a load keeps only the prompt's newest sequences: at most LOAD_NEWEST of them and
LOAD_TOKENS tokens (`srt rollout --load-tokens`). The older ones stay in the store until decay
or `srt cache prune` removes them. `store` is any `seqstore.SequenceStore`.
"""

from __future__ import annotations

from typing import Any

from cache_store.suffix_tree import SuffixTree

LOAD_NEWEST = 1 << 17  # sequences a load keeps at most (a suffix tree holds 524,287)
LOAD_TOKENS = 1 << 17  # tokens a load keeps at most: one epoch of 16 x 8,192-token rollouts


def newest_stored(store: Any, uid: str, newest: int = LOAD_NEWEST, tokens: int = LOAD_TOKENS) -> list:
    """What a load puts in the prompt's tree: its newest stored sequences above the floor
    (`StoredSequence`s), at most `newest` of them and `tokens` tokens in all (the newest one
    whatever its length), oldest first."""
    return store.read(uid, newest, tokens)


def load_tree(store: Any, uid: str, max_depth: int = 64, newest: int = LOAD_NEWEST,
              tokens: int = LOAD_TOKENS) -> SuffixTree:
    """The prompt's tree: `newest_stored`, weighted by their decay."""
    seqs = newest_stored(store, uid, newest, tokens)
    return SuffixTree.from_sequences(((s.tokens, s.weight, s.probs) for s in seqs), max_depth)
