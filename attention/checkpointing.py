"""Gradient checkpointing of a model's decoder layers that keeps packed rows exact.

A checkpointed layer keeps only its inputs in the forward and runs again in the backward to
rebuild what its gradient needs, so a step holds one hidden state per token per layer (plus one
layer's intermediates at a time) instead of every layer's attention and MLP activations, for
one more forward of each layer (docs/train.md, "Memory", has the measured figures).

transformers' own gradient checkpointing does not serve `srt train`: it checkpoints only in
train mode (srt trains with dropout off, in eval mode), and it knows nothing of packed rows:
its recomputation runs after `tree_attention` has exited, where a layer would attend over the
whole packed row causally. Here every decoder layer (transformers' `GradientCheckpointingLayer`,
the class each model's layers derive from) checkpoints its forward whenever autograd records,
with `attention.hf.recompute_context` putting the row back around the recomputation. Forwards
without gradients (the reference model, log-probs under `no_grad`) run as before.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from attention.hf import recompute_context

_MARK = "_srt_checkpointed"


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers: the modules transformers lets checkpoint."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpoint_layers(model: torch.nn.Module) -> int:
    """Checkpoint every decoder layer of `model` (idempotent); returns how many. Raises
    ValueError for a model without transformers' decoder layers."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layers srt can checkpoint")
    for layer in layers:
        if not getattr(layer, _MARK, False):
            layer.forward = functools.partial(_checkpointed, layer.forward)
            setattr(layer, _MARK, True)
    return len(layers)


def _checkpointed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=recompute_context, **kwargs)
