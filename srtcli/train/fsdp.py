"""FSDP2 for `srt train --fsdp`: parameters, gradients and optimizer state sharded over ranks.

Each decoder layer (the model's `_no_split_modules` classes) and then the whole model get
`fully_shard`, so a rank holds 1/N of everything between forwards. What changes elsewhere:

- gradients: FSDP reduce-scatters them with an *average*; the loss is already normalised by
  global counts (srtcli.train.loss), so each micro-batch's loss is scaled by the world size
  before backward, which turns the average back into the exact sum (gloo has no PREMUL_SUM,
  so a divide factor of 1 is not an option on CPU). Gradient sync runs on the last
  micro-batch only;
- every rank must run the same number of forwards (each one all-gathers parameters): a rank
  with fewer micro-batches runs the batch's smallest row again with its loss multiplied by 0;
- packed rows: `attention.row_logprobs` scores the LM head by calling the base model and the
  head separately, which would bypass the root module's all-gather; `RootForward` hides the
  split so it runs the whole (root) model and scores its logits;
- checkpoints: the full model and optimizer state dicts are gathered (collectively) and rank
  0 writes them; any world size can resume them.
"""

from __future__ import annotations

from typing import Any

import torch


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Apply FSDP2 to each decoder layer, then to the root; returns the same module."""
    from torch.distributed.fsdp import fully_shard

    names = set(getattr(model, "_no_split_modules", None) or [])
    for m in list(model.modules()):
        if m is not model and type(m).__name__ in names:
            fully_shard(m)
    fully_shard(model)
    return model


class RootForward(torch.nn.Module):
    """The model seen as a plain callable: no base model / LM head to split apart."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model
        self.config = model.config

    def forward(self, **kwargs: Any):
        return self.inner(**kwargs)


def set_sync(model: torch.nn.Module, on: bool) -> None:
    model.set_requires_gradient_sync(on)


def full_states(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model state dict, optimizer state dict), full and on CPU; a collective call."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)


def load_optimizer(model: torch.nn.Module, opt: torch.optim.Optimizer, full: dict) -> None:
    """Shard a full optimizer state dict (as `full_states` saved it) into `opt`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, opt, optim_state_dict=full, options=StateDictOptions(full_state_dict=True))
