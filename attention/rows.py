"""Rows: bin-packing several groups' prefix trees into padded rows of at most `max_tokens`.

A row is a forest: trees are concatenated, and since every token's `subtree_end` stays inside
its own tree the interval mask keeps them apart with no extra bookkeeping. A group whose tree
does not fit one row is split into sub-groups that each fit: the group's sequences are taken
in sorted (pre-order) order and cut into contiguous runs, because neighbours in sorted order
share the longest prefixes, so contiguous runs lose the least sharing. Rows are padded to a
multiple of `pad_to` (FlexAttention works in 128-token blocks); a pad token sees only itself,
so no attention row is empty (no NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from attention.prefix_tree import PrefixTree, sorted_lcp, token_array


class SequenceTooLong(ValueError):
    """A single sequence does not fit in a row; `index` is its flattened input index."""

    def __init__(self, index: int, length: int, max_tokens: int):
        super().__init__(f"sequence {index} has {length} tokens, more than max_tokens={max_tokens}")
        self.index, self.length, self.max_tokens = index, length, max_tokens


@dataclass
class PackedRow:
    """One padded forward row. Tensors are int64 [T_padded] on CPU."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    subtree_end: torch.Tensor
    paths: list[torch.Tensor]  # per sequence in this row: its packed indices, in order
    seq_ids: list[int]  # flattened input index of each path's sequence
    n_real: int  # tokens before padding

    def __len__(self) -> int:
        return int(self.input_ids.numel())


def split_group(seqs: list[np.ndarray], ids: list[int], max_tokens: int) -> list[list[int]]:
    """Cut a group into sub-groups (lists of flattened ids) whose trees each fit `max_tokens`.

    Greedy over the sorted order: adding sorted sequence i to the current run costs exactly
    len_i - lcp(i-1, i) new packed tokens (its sorted predecessor is its deepest sharer).
    """
    order, lcp = sorted_lcp(seqs)
    parts: list[list[int]] = []
    size = 0
    for rank, i in enumerate(order):
        n = len(seqs[i])
        if n > max_tokens:
            raise SequenceTooLong(ids[i], n, max_tokens)
        cost = n - (int(lcp[rank]) if parts and rank > 0 else 0)
        if not parts or size + cost > max_tokens:
            parts.append([])
            size, cost = 0, n
        parts[-1].append(ids[i])
        size += cost
    return parts


def _group_trees(arrays: list[np.ndarray], ids: list[int], max_tokens: int):
    """The group's tree, or its sub-trees when it does not fit a row."""
    tree = PrefixTree.build(arrays)
    if tree.packed_tokens() <= max_tokens:
        return [(tree, ids)]
    return [(PrefixTree.build([arrays[i - ids[0]] for i in part]), part) for part in split_group(arrays, ids, max_tokens)]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m if m > 1 else n


def pack_rows(
    groups: list[list[list[int]]],
    max_tokens: int = 8192,
    pad_to: int = 128,
    on_group: Callable[[], None] | None = None,
) -> list[PackedRow]:
    """Pack groups (each: the sequences sharing a prompt) into rows of <= max_tokens real tokens.

    Every sequence lands in exactly one row; `seq_ids` index the flattened input
    (group 0's sequences first). Rows are padded to a multiple of `pad_to`.
    Raises `SequenceTooLong` for a sequence longer than `max_tokens`. `on_group` is called
    after each group's tree is built (progress reporting).
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    trees: list[tuple[PrefixTree, list[int]]] = []
    base = 0
    for group in groups:
        arrays = [token_array(s) for s in group]
        ids = list(range(base, base + len(arrays)))
        base += len(arrays)
        if arrays:
            trees.extend(_group_trees(arrays, ids, max_tokens))
        if on_group is not None:
            on_group()
    # first-fit decreasing: big trees first, each into the first row with room
    trees.sort(key=lambda t: -t[0].packed_tokens())
    bins: list[list[tuple[PrefixTree, list[int]]]] = []
    room: list[int] = []
    for tree, ids in trees:
        size = tree.packed_tokens()
        slot = next((b for b, r in enumerate(room) if r >= size), None)
        if slot is None:
            bins.append([])
            room.append(max_tokens)
            slot = len(bins) - 1
        bins[slot].append((tree, ids))
        room[slot] -= size
    return [_concat(b, pad_to) for b in bins]


def _concat(members: list[tuple[PrefixTree, list[int]]], pad_to: int) -> PackedRow:
    """Lay trees side by side, shift their indices, and pad."""
    ids, pos, end, paths, seq_ids = [], [], [], [], []
    offset = 0
    for tree, sids in members:
        p = tree.pack()
        ids.append(p.input_ids)
        pos.append(p.position_ids)
        end.append(p.subtree_end + offset)
        paths.extend(path + offset for path in p.paths)
        seq_ids.extend(sids)
        offset += len(p.input_ids)
    n_real = offset
    total = _round_up(max(n_real, 1), pad_to)
    pad = torch.arange(n_real, total, dtype=torch.int64)
    return PackedRow(
        input_ids=torch.cat(ids + [torch.zeros(total - n_real, dtype=torch.int64)]),
        position_ids=torch.cat(pos + [torch.zeros(total - n_real, dtype=torch.int64)]),
        subtree_end=torch.cat(end + [pad]),  # a pad token's subtree is itself: it sees only itself
        paths=paths,
        seq_ids=seq_ids,
        n_real=n_real,
    )
