"""Prefix-tree packing and tree attention: many sequences that share prefixes, one forward.

How the pieces fit:

- `prefix_tree.PrefixTree`: the compressed trie of one group, laid out in pre-order
  (packed ids, depth position ids, `subtree_end`, each sequence's path);
- `rows.pack_rows` -> `PackedRow`: several groups' trees bin-packed into padded rows,
  oversized groups split into sub-trees;
- `masks`: the interval rule `k <= q <= subtree_end[k]` as an SDPA bool mask, a
  FlexAttention mask_mod / BlockMask, and a dense reference for tests;
- `hf`: the `srt_tree` attention function for transformers models and the
  `tree_attention(model, ...)` context manager (backends auto|sdpa|flex|eager);
- `logprobs`: per-sequence log-probs / entropies from one forward per row.

Uses torch; never touches LMDB.
"""

from attention.hf import BACKENDS, resolve_backend, tree_attention
from attention.logprobs import row_logprobs, tree_logprobs
from attention.prefix_tree import PackedTree, PrefixTree
from attention.rows import PackedRow, SequenceTooLong, pack_rows

__all__ = [
    "BACKENDS",
    "PackedRow",
    "PackedTree",
    "PrefixTree",
    "SequenceTooLong",
    "pack_rows",
    "resolve_backend",
    "row_logprobs",
    "tree_attention",
    "tree_logprobs",
]
