"""The tiny random models tests and benchmarks build: the same call, the same model."""

import pytest
import torch

from srtcli.tiny_model import tiny_model


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_seed_builds_the_same_weights_every_time(kind):
    a, b, other = weights(tiny_model(kind, seed=3)), weights(tiny_model(kind, seed=3)), weights(tiny_model(kind, seed=4))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], other[k]) for k in a)


def test_shape_config_and_sharpness():
    m = tiny_model("qwen2", vocab=20, hidden=64, max_positions=128, initializer_range=0.1)
    c = m.config
    assert (type(m).__name__, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
            c.num_attention_heads, c.num_key_value_heads, c.max_position_embeddings, c.initializer_range) == \
        ("Qwen2ForCausalLM", 20, 64, 128, 2, 4, 2, 128, 0.1)
    assert not m.training and m.lm_head.weight.dtype == torch.float32
    sharp = tiny_model("qwen2", vocab=20, hidden=64, max_positions=128, initializer_range=0.1, sharp=3.0)
    assert torch.equal(sharp.lm_head.weight, 3.0 * m.lm_head.weight)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        tiny_model("gpt2")
