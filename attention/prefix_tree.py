"""The compressed prefix tree (trie) of one group of sequences, laid out in pre-order.

Why pre-order of a *sorted* list is all we need: visit the trie's children in token order and
the tokens appear in exactly the order of the lexicographically sorted sequences, each
contributing only the suffix it does not share with its sorted predecessor
(`s_i[lcp(s_{i-1}, s_i):]`). So the whole layout follows from one sort and the longest
common prefixes of neighbours, with no per-token Python work:

- packed ids     = concat of those new suffixes;
- position ids   = depth = index of the token within its sequence (RoPE sees real positions);
- subtree_end[p] = last packed index of the subtree under token p: the new suffixes of the
  run of following sorted sequences whose common prefix with p's sequence reaches past p;
- paths          = a sequence's packed indices: its predecessor's path up to the lcp, then
  its own new suffix.

The attention rule of the packed row is then an interval test (see attention.masks):
query q may see key k iff k <= q <= subtree_end[k].

Node boundaries (for inspection; the mask and log-probs never need them) sit at every new
suffix start and wherever a later sequence branches off, so a sequence that ends inside a
chain (a step that a later step extends) ends exactly at a node boundary, and duplicates
share every node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PackedTree:
    """One tree flattened to a packed sequence. All index tensors are int64 on CPU."""

    input_ids: torch.Tensor  # [T] token ids in pre-order
    position_ids: torch.Tensor  # [T] depth of each token (0 at the root's first token)
    subtree_end: torch.Tensor  # [T] last packed index of the token's subtree (inclusive)
    paths: list[torch.Tensor]  # per input sequence (input order): its packed indices, in order


def token_array(seq: list[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    """A sequence of token ids as an int64 numpy array (a CPU copy of a tensor)."""
    if isinstance(seq, torch.Tensor):
        return seq.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(seq, dtype=np.int64)


def _neighbour_lcp(sorted_arrays: list[np.ndarray]) -> np.ndarray:
    """lcp[i] = longest common prefix of sorted sequence i and i-1 (lcp[0] = 0), vectorized."""
    n = len(sorted_arrays)
    lcp = np.zeros(n, dtype=np.int64)
    if n < 2:
        return lcp
    lens = np.array([len(a) for a in sorted_arrays], dtype=np.int64)
    width = int(lens.max())
    grid = np.full((n, width + 1), -1, dtype=np.int64)  # -1 never equals a token id
    for i, a in enumerate(sorted_arrays):  # one row copy per sequence, not per token
        grid[i, : len(a)] = a
    diff = grid[1:] != grid[:-1]
    # first differing column; rows equal everywhere (duplicates) share their whole length
    first = np.where(diff.any(axis=1), diff.argmax(axis=1), width)
    lcp[1:] = np.minimum(first, np.minimum(lens[1:], lens[:-1]))
    return lcp


def sorted_lcp(arrays: list[np.ndarray]) -> tuple[list[int], np.ndarray]:
    """(the sequences' indices in lexicographic order, the lcp of each sorted sequence with its
    sorted predecessor): the whole layout of a group's tree follows from these two."""
    # Python's list sort compares tuples in C; n is a group size (tens), not a token count.
    keys = [tuple(a.tolist()) for a in arrays]
    order = sorted(range(len(arrays)), key=keys.__getitem__)
    return order, _neighbour_lcp([arrays[i] for i in order])


class PrefixTree:
    """The compressed trie of a group; build with `PrefixTree.build(sequences)`."""

    def __init__(self, sequences: list[np.ndarray], order: np.ndarray, lcp: np.ndarray):
        self._seqs = sequences  # input order
        self._order = order  # sorted position -> input index
        self._lcp = lcp  # per sorted position
        self._packed: PackedTree | None = None

    @classmethod
    def build(cls, sequences: list[list[int]]) -> "PrefixTree":
        """Build the tree of `sequences` (each non-empty, ids >= 0)."""
        if len(sequences) == 0:
            raise ValueError("a prefix tree needs at least one sequence")
        arrays = [token_array(s) for s in sequences]
        for i, a in enumerate(arrays):
            if a.ndim != 1 or a.size == 0:
                raise ValueError(f"sequence {i} is empty")
        order, lcp = sorted_lcp(arrays)
        return cls(arrays, np.array(order, dtype=np.int64), lcp)

    # -- sizes -------------------------------------------------------------------------
    def original_tokens(self) -> int:
        """Sum of the sequence lengths (what separate forwards would process)."""
        return int(sum(len(a) for a in self._seqs))

    def packed_tokens(self) -> int:
        """Tokens in the packed sequence = distinct non-empty prefixes of the group."""
        lens = np.array([len(self._seqs[i]) for i in self._order], dtype=np.int64)
        return int((lens - self._lcp).sum())

    def token_ratio(self) -> float:
        """Packed tokens / original tokens (1.0 means no sharing)."""
        return self.packed_tokens() / self.original_tokens()

    # -- layout ------------------------------------------------------------------------
    def pack(self) -> PackedTree:
        """The packed sequence (cached: the tree is immutable)."""
        if self._packed is None:
            self._packed = self._layout()
        return self._packed

    def _layout(self) -> PackedTree:
        order, lcp = self._order, self._lcp
        n = len(order)
        sorted_seqs = [self._seqs[i] for i in order]
        lens = np.array([len(a) for a in sorted_seqs], dtype=np.int64)
        new = lens - lcp
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new, out=off[1:])
        total = int(off[-1])
        ids = np.concatenate([a[l:] for a, l in zip(sorted_seqs, lcp)])
        pos = np.concatenate([np.arange(l, e, dtype=np.int64) for l, e in zip(lcp, lens)])
        end = np.empty(total, dtype=np.int64)
        for i in range(n):  # per sequence, vectorized over its new tokens
            if new[i] == 0:
                continue
            depths = np.arange(lcp[i], lens[i], dtype=np.int64)
            # run min of lcp over the following sequences: how deep each still shares with i
            shared = np.minimum.accumulate(lcp[i + 1 :]) if i + 1 < n else np.zeros(0, np.int64)
            # number of following sequences that go through the token at depth d: shared > d
            count = np.searchsorted(-shared, -depths, side="left")
            end[off[i] : off[i + 1]] = off[i + 1 + count] - 1
        paths_sorted: list[np.ndarray] = []
        for i in range(n):
            own = np.arange(off[i], off[i + 1], dtype=np.int64)
            prev = paths_sorted[i - 1][: lcp[i]] if i > 0 else own[:0]
            paths_sorted.append(np.concatenate([prev, own]))
        paths: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        for rank, idx in enumerate(order):
            paths[idx] = torch.from_numpy(paths_sorted[rank])
        return PackedTree(
            input_ids=torch.from_numpy(ids),
            position_ids=torch.from_numpy(pos),
            subtree_end=torch.from_numpy(end),
            paths=paths,
        )

    def node_spans(self) -> list[tuple[int, int]]:
        """The compressed nodes as inclusive packed (start, end) spans, in pre-order."""
        p = self.pack()
        total = len(p.input_ids)
        lens = np.array([len(self._seqs[i]) for i in self._order], dtype=np.int64)
        new = lens - self._lcp
        off = np.concatenate([[0], np.cumsum(new)])
        starts = np.zeros(total, dtype=bool)
        starts[off[:-1][new > 0]] = True  # every new suffix starts a node
        se = p.subtree_end.numpy()
        starts[1:] |= se[1:] != se[:-1]  # a later sequence branches off here
        first = np.flatnonzero(starts)
        last = np.append(first[1:] - 1, total - 1)
        return [(int(a), int(b)) for a, b in zip(first, last)]
