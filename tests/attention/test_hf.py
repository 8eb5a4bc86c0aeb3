"""The transformers integration: backend choice, restoring the model, refusing what it cannot do."""

from __future__ import annotations

import pytest
import torch

from attention import pack_rows, resolve_backend, tree_attention
from attention.hf import NAME, srt_tree_attention
from tests.attention.conftest import tiny_model


def test_attn_flag_maps_onto_backends():
    assert resolve_backend("auto", "cpu") == "sdpa"
    assert resolve_backend("auto", "cuda") == "flex"
    for b in ("sdpa", "flex", "eager"):
        assert resolve_backend(b, "cpu") == b
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_backend("flash", "cpu")


def test_the_model_is_restored_even_when_the_forward_fails():
    model = tiny_model("llama")
    row = pack_rows([[[1, 2, 3]]], max_tokens=16, pad_to=1)[0]
    with pytest.raises(ValueError, match="batch size 1"):
        with tree_attention(model, row.subtree_end, row.position_ids, "sdpa"):
            assert model.config._attn_implementation == NAME
            model(input_ids=torch.tensor([[1, 2, 3], [1, 2, 3]]), use_cache=False)
    assert model.config._attn_implementation == "sdpa"


def test_unsupported_attention_features_are_refused_not_ignored():
    model = tiny_model("qwen2")
    attn = model.model.layers[0].self_attn
    row = pack_rows([[[1, 2, 3]]], max_tokens=16, pad_to=1)[0]
    q = torch.randn(1, 4, 3, 16)
    kv = torch.randn(1, 2, 3, 16)
    with tree_attention(model, row.subtree_end, row.position_ids, "sdpa"):
        out, _ = srt_tree_attention(attn, q, kv, kv, None, scaling=0.25)
        assert out.shape == (1, 3, 4, 16)
        with pytest.raises(NotImplementedError, match="softcap"):
            srt_tree_attention(attn, q, kv, kv, None, scaling=0.25, softcap=30.0)
