"""pack_rows: bin-packing trees into rows, splitting big groups, padding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import PrefixTree, SequenceTooLong, pack_rows
from attention.masks import dense_reference_mask, sdpa_bool_mask


def flat(groups):
    return [s for g in groups for s in g]


def check_rows(groups, rows, max_tokens, pad_to):
    seqs = flat(groups)
    seen = sorted(i for r in rows for i in r.seq_ids)
    assert seen == list(range(len(seqs)))  # every sequence exactly once
    for r in rows:
        assert r.n_real <= max_tokens
        assert len(r) % pad_to == 0 and len(r) - r.n_real < pad_to
        for sid, path in zip(r.seq_ids, r.paths):
            assert r.input_ids[path].tolist() == seqs[sid]
            assert r.position_ids[path].tolist() == list(range(len(seqs[sid])))
        # the interval mask equals the mask built from paths: trees never see each other
        ref = dense_reference_mask(r.paths, len(r))
        assert torch.equal(sdpa_bool_mask(r.subtree_end)[0, 0], ref)
        pad = torch.arange(r.n_real, len(r))
        assert torch.equal(r.subtree_end[pad], pad)  # a pad token sees only itself


def test_several_groups_share_a_row_and_stay_apart():
    groups = [[[1, 2, 3], [1, 2, 4]], [[1, 2, 3]], [[9, 9]]]
    rows = pack_rows(groups, max_tokens=64, pad_to=16)
    assert len(rows) == 1
    r = rows[0]
    assert r.n_real == 4 + 3 + 2  # no sharing across groups: each group is its own tree
    check_rows(groups, rows, 64, 16)


def test_a_group_larger_than_a_row_is_split_keeping_its_sharing():
    a = [7] * 30
    b = [8] * 30
    # two families of 4 sequences; each family shares 30 tokens; a family's tree is 34 tokens
    group = [a + [i] for i in range(4)] + [b + [i] for i in range(4)]
    rows = pack_rows([group], max_tokens=40, pad_to=8)
    assert len(rows) == 2
    assert sorted(r.n_real for r in rows) == [34, 34]  # each family whole: no sharing lost
    check_rows([group], rows, 40, 8)


def test_a_sequence_longer_than_a_row_is_an_error_naming_it():
    with pytest.raises(SequenceTooLong) as e:
        pack_rows([[[1, 2]], [[1, 2, 3], [4] * 11]], max_tokens=10)
    assert e.value.index == 2 and e.value.length == 11


groups_st = st.lists(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=10), min_size=1, max_size=6), min_size=1, max_size=5
)


@settings(max_examples=100, deadline=None)
@given(groups_st, st.integers(10, 40), st.sampled_from([1, 8, 128]))
def test_random_forests_pack_correctly(groups, max_tokens, pad_to):
    rows = pack_rows(groups, max_tokens=max_tokens, pad_to=pad_to)
    check_rows(groups, rows, max_tokens, pad_to)
    # splitting only happens when a group's tree does not fit
    whole = sum(PrefixTree.build(g).packed_tokens() for g in groups)
    assert sum(r.n_real for r in rows) >= whole
    if all(PrefixTree.build(g).packed_tokens() <= max_tokens for g in groups):
        assert sum(r.n_real for r in rows) == whole
