"""The transformers integration: backend choice, restoring the model, softcapping, refusing what it cannot do."""

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


def test_softcapping_is_computed_and_sinks_are_refused_not_ignored():
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    model = tiny_model("qwen2")
    attn = model.model.layers[0].self_attn
    row = pack_rows([[[1, 2, 3]]], max_tokens=16, pad_to=1)[0]
    torch.manual_seed(0)
    q, kv = torch.randn(1, 4, 3, 16) * 4, torch.randn(1, 2, 3, 16) * 4
    causal = torch.zeros(3, 3).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))[None, None]
    want, _ = eager_attention_forward(attn, q, kv, kv, causal, scaling=0.25, softcap=2.0)
    plain, _ = eager_attention_forward(attn, q, kv, kv, causal, scaling=0.25)
    assert (want - plain).abs().max() > 1e-2  # the softcap matters here
    for backend in ("sdpa", "eager", "flex"):
        with tree_attention(model, row.subtree_end, row.position_ids, backend):
            out, _ = srt_tree_attention(attn, q, kv, kv, None, scaling=0.25, softcap=2.0)
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    with tree_attention(model, row.subtree_end, row.position_ids, "sdpa"):
        with pytest.raises(NotImplementedError, match="s_aux"):
            srt_tree_attention(attn, q, kv, kv, None, scaling=0.25, s_aux=torch.zeros(4))
