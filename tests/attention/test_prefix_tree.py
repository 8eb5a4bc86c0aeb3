"""PrefixTree: layout, positions, subtree ends, paths, and the optimal token ratio."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import PrefixTree


def distinct_prefixes(seqs):
    return len({tuple(s[: i + 1]) for s in seqs for i in range(len(s))})


def brute_subtree_end(seqs, packed):
    """Last packed index among tokens whose path passes through token p (from the paths alone)."""
    end = list(range(len(packed.input_ids)))
    for path in packed.paths:
        for j, p in enumerate(path.tolist()):
            end[p] = max(end[p], path[-1].item())
    return end


def test_the_seed_example_exactly():
    t = PrefixTree.build([[1, 2, 3, 4, 5], [1, 2, 3, 6, 7], [1, 2, 3, 6, 7, 8, 9]])
    p = t.pack()
    assert p.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert p.position_ids.tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 6]
    assert p.subtree_end.tolist() == [8, 8, 8, 4, 4, 8, 8, 8, 8]
    assert [x.tolist() for x in p.paths] == [[0, 1, 2, 3, 4], [0, 1, 2, 5, 6], [0, 1, 2, 5, 6, 7, 8]]
    assert t.node_spans() == [(0, 2), (3, 4), (5, 6), (7, 8)]
    assert t.token_ratio() == pytest.approx(9 / 17)


def test_prefix_steps_end_on_node_boundaries_and_duplicates_share_every_node():
    # multi-turn: each step extends the last; a duplicate; a sequence sharing nothing
    seqs = [[1, 2, 3, 4], [1, 2], [1, 2, 3, 4, 5, 6], [1, 2], [7]]
    t = PrefixTree.build(seqs)
    p = t.pack()
    assert p.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert t.node_spans() == [(0, 1), (2, 3), (4, 5), (6, 6)]  # cuts where steps 0 and 1 end
    assert p.paths[1].tolist() == p.paths[3].tolist() == [0, 1]
    assert p.subtree_end.tolist() == [5, 5, 5, 5, 5, 5, 6]  # [7] is its own tree
    assert t.packed_tokens() == distinct_prefixes(seqs) == 7


def test_input_order_is_kept_and_empty_input_is_rejected():
    t = PrefixTree.build([[5, 5], [1], [5]])
    p = t.pack()
    assert [p.input_ids[x].tolist() for x in p.paths] == [[5, 5], [1], [5]]
    with pytest.raises(ValueError):
        PrefixTree.build([])
    with pytest.raises(ValueError):
        PrefixTree.build([[1], []])


groups = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=10)


@settings(max_examples=150, deadline=None)
@given(groups)
def test_layout_invariants_on_random_groups(seqs):
    t = PrefixTree.build(seqs)
    p = t.pack()
    # optimal: one packed token per distinct non-empty prefix
    assert t.packed_tokens() == len(p.input_ids) == distinct_prefixes(seqs)
    assert t.token_ratio() == pytest.approx(distinct_prefixes(seqs) / sum(map(len, seqs)))
    for s, path in zip(seqs, p.paths):
        assert p.input_ids[path].tolist() == s  # the path spells the sequence
        assert p.position_ids[path].tolist() == list(range(len(s)))  # positions = depth
        assert bool((path[1:] > path[:-1]).all())  # pre-order: ancestors come first
    assert p.subtree_end.tolist() == brute_subtree_end(seqs, p)
    # nodes tile the packed sequence and no sequence ends inside a node
    spans = t.node_spans()
    assert spans[0][0] == 0 and spans[-1][1] == len(p.input_ids) - 1
    ends = {path[-1].item() for path in p.paths}
    assert ends <= {b for _, b in spans}


def test_tensor_and_numpy_inputs():
    import numpy as np

    a = PrefixTree.build([torch.tensor([1, 2, 3]), np.array([1, 2, 4])]).pack()
    assert a.input_ids.tolist() == [1, 2, 3, 4]
    assert a.input_ids.dtype == torch.int64
