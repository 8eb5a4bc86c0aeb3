"""Tree masks: SDPA bool mask and FlexAttention mask_mod against a dense reference from paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import pack_rows
from attention.masks import dense_reference_mask, sdpa_blocks, sdpa_bool_mask, tree_block_mask, tree_mask_mod

forests = st.lists(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=9), min_size=1, max_size=5), min_size=1, max_size=4
)


def grid(mask_mod, t):
    q = torch.arange(t)[:, None].expand(t, t)
    k = torch.arange(t)[None, :].expand(t, t)
    zero = torch.zeros((), dtype=torch.int64)
    return mask_mod(zero, zero, q, k)


@settings(max_examples=120, deadline=None)
@given(forests, st.sampled_from([1, 4, 16]))
def test_bool_mask_and_mask_mod_equal_the_dense_reference(groups, pad_to):
    for row in pack_rows(groups, max_tokens=24, pad_to=pad_to):
        ref = dense_reference_mask(row.paths, len(row))
        assert torch.equal(sdpa_bool_mask(row.subtree_end)[0, 0], ref)
        assert torch.equal(grid(tree_mask_mod(row.subtree_end), len(row)), ref)
        assert bool(ref.any(-1).all())  # every query (pads included) sees something: no NaN rows


@settings(max_examples=80, deadline=None)
@given(forests, st.sampled_from([1, 4, 16]), st.sampled_from([1, 3, 8, 512]))
def test_query_blocks_cover_exactly_the_visible_keys(groups, pad_to, block):
    for row in pack_rows(groups, max_tokens=24, pad_to=pad_to):
        t = len(row)
        ref = dense_reference_mask(row.paths, t)
        rebuilt = torch.zeros(t, t, dtype=torch.bool)
        covered = torch.zeros(t, t, dtype=torch.bool)
        for a, b, keys, m in sdpa_blocks(row.subtree_end, block=block):
            rebuilt[a:b, keys] = m[0, 0]
            covered[a:b, keys] = True
        assert torch.equal(rebuilt, ref)
        assert not bool((ref & ~covered).any())  # no visible key is cut off by a block's key range


def test_query_blocks_skip_other_trees():
    row = pack_rows([[[1] * 8], [[2] * 8]], max_tokens=64, pad_to=1)[0]
    blocks = sdpa_blocks(row.subtree_end, block=8)
    assert [(a, b, keys) for a, b, keys, _ in blocks] == [(0, 8, slice(0, 8)), (8, 16, slice(8, 16))]


def test_query_blocks_skip_earlier_sibling_branches():
    # prompt [9, 9] then three branches of 4 tokens: packed 0-1 prompt, 2-5, 6-9, 10-13
    row = pack_rows([[[9, 9, 1, 1, 1, 1], [9, 9, 2, 2, 2, 2], [9, 9, 3, 3, 3, 3]]], max_tokens=64, pad_to=1)[0]
    blocks = sdpa_blocks(row.subtree_end, block=4)
    last = blocks[-1]  # queries 12-13, inside the third branch
    assert last[2].tolist() == [0, 1, 10, 11, 12, 13]  # the prompt and its own branch, no siblings


def test_the_reference_check_catches_wrong_masks():
    row = pack_rows([[[1, 2, 3], [1, 2, 4, 5], [6]]], max_tokens=32, pad_to=1)[0]
    ref = dense_reference_mask(row.paths, len(row))
    t = len(row)
    causal = torch.ones(t, t, dtype=torch.bool).tril()  # plain packing: siblings leak
    assert not torch.equal(causal, ref)
    off_by_one = grid(lambda b, h, q, k: (k <= q) & (q < row.subtree_end[k]), t)
    assert not torch.equal(off_by_one, ref)


def test_sliding_window_is_measured_in_depth():
    row = pack_rows([[[1, 2, 3, 4], [1, 2, 5, 6]]], max_tokens=32, pad_to=1)[0]
    m = sdpa_bool_mask(row.subtree_end, row.position_ids, sliding_window=2)[0, 0]
    g = grid(tree_mask_mod(row.subtree_end, row.position_ids, 2), len(row))
    assert torch.equal(m, g)
    # token 6 (depth 3) sees 5 (depth 2) and itself, not 2 (depth 1): a window of 2 positions
    i6, i5, i2 = (row.input_ids == 6).nonzero().item(), (row.input_ids == 5).nonzero().item(), 1
    assert m[i6, i5] and m[i6, i6] and not m[i6, i2]


def test_block_mask_on_cpu_matches_at_block_level():
    # uncompiled create_block_mask on CPU (the CUDA path compiles it; same mask_mod)
    row = pack_rows([[[1] * 100 + [2] * 60, [1] * 100 + [3] * 90], [[4] * 200]], max_tokens=512, pad_to=128)[0]
    bm = tree_block_mask(row.subtree_end, compile=False)
    dense = sdpa_bool_mask(row.subtree_end)[0, 0]
    nb = len(row) // 128
    blocks = dense.view(nb, 128, nb, 128).any(-1).any(1)
    got = bm.to_dense()[0, 0].bool()
    assert torch.equal(got, blocks)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention BlockMask needs CUDA; none here")
def test_compiled_block_mask_on_cuda():
    row = pack_rows([[[1] * 100 + [2] * 60, [1] * 100 + [3] * 90], [[4] * 200]], max_tokens=512, pad_to=128)[0]
    se = row.subtree_end.cuda()
    bm = tree_block_mask(se)
    dense = sdpa_bool_mask(se)[0, 0]
    nb = len(row) // 128
    assert torch.equal(bm.to_dense()[0, 0].bool(), dense.view(nb, 128, nb, 128).any(-1).any(1))
