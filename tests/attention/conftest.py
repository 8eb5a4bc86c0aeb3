"""Shared helpers for the attention tests: tiny real HF models and separate-forward references."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


def pytest_configure(config):
    # eager (uncompiled) FlexAttention on CPU warns; the tests use it on purpose
    config.addinivalue_line("filterwarnings", "ignore:flex_attention called without torch.compile")


def tiny_model(kind: str = "qwen2", seed: int = 0, vocab: int = 100):
    """A random tiny causal LM: hidden 64, 2 layers, 4 heads, 2 KV heads (GQA), RoPE, float32."""
    from srtcli.tiny_model import tiny_model as build

    # init larger than the default 0.02, so attention is sharp and a wrong mask or position shows
    return build(kind, vocab, seed, hidden=64, max_positions=1024, rope_theta=10000.0, initializer_range=0.1,
                 attn_implementation="sdpa")


def separate_logprobs(model, seq: list[int], entropy: bool = False):
    """The reference: one ordinary forward of `seq` alone."""
    ids = torch.tensor([seq])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    logp = logits.log_softmax(-1)
    lp = logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
    if not entropy:
        return lp
    return lp, -(logp.exp() * logp).sum(-1)[:-1]


def max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    assert len(got) == len(want)
    worst = 0.0
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        if g.numel():
            worst = max(worst, (g.detach() - w.detach()).abs().max().item())
    return worst


def grads(model, loss_fn) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss_fn().backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_grads_close(got: dict, want: dict, rel: float = 1e-4) -> None:
    assert got.keys() == want.keys()
    for name in want:
        scale = want[name].abs().max().item() + 1e-12
        err = (got[name] - want[name]).abs().max().item()
        assert err <= rel * scale + 1e-7, f"{name}: max abs err {err:.3g} vs scale {scale:.3g}"


@pytest.fixture(params=["qwen2", "llama"])
def model(request):
    return tiny_model(request.param)
