"""What a rollout needs to know of the model, whichever engine runs it: how long a sequence may
be, and which tokens end one. Each engine reads the raw values its own way (the loaded model's
config, or the model directory's JSON files); the rules are these.
"""

from __future__ import annotations

from typing import Any


def context_length(max_positions: int | None, tok: Any) -> int:
    """The model's positions (2048 when it does not say), capped by the tokenizer's own limit."""
    ctx = max_positions or 2048
    tmax = getattr(tok, "model_max_length", None)
    if isinstance(tmax, int) and 0 < tmax < ctx:
        ctx = tmax
    return int(ctx)


def eos_ids(tok: Any, generation_eos: int | list[int] | None) -> list[int]:
    """The tokenizer's eos plus any the model's generation config lists (one id or a list)."""
    ids = {tok.eos_token_id}
    if isinstance(generation_eos, (list, tuple)):
        ids.update(generation_eos)
    elif generation_eos is not None:
        ids.add(generation_eos)
    return sorted(int(i) for i in ids if i is not None)
