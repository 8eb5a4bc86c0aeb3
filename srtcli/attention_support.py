"""What srt's own attention implements, checked on a loaded model before anything runs.

srt replaces a model's attention in the rollout engine (`srt_slots`,
`srtcli.rollout.engine.kv_cache`) and in packed training (`srt_tree`, `attention.hf`). Both
compute what transformers' eager attention computes from what each layer passes: scaled
dot-product attention with the layer's `scaling` and grouped KV heads, the layer's
`sliding_window` (key k visible to query q iff 0 <= pos_q - pos_k < window, positions being
tree depths in a packed row) and the layer's attention logit `softcap`
(softcap * tanh(scores / softcap), before the mask). Anything else a model's attention carries
would be silently dropped, so `check_attention` refuses it with one line, finding it from the
model itself with probe forwards through a recording attention:

1. with the model's own masks: every layer must call transformers' attention interface (a model
   computing attention its own way, e.g. Bloom's ALiBi, does not), pass nothing with a value
   beyond the arguments above (attention sinks `s_aux`, a `position_bias`, ...), and build a
   causal mask narrowed by exactly its `sliding_window` (not bidirectional, chunked, ...);
2. with an explicit 4-D additive mask, as the engine passes one: every layer must receive it
   unchanged (a model adding a bias to the mask is refused).

It also makes the model's own forwards exact where transformers' are not: its sdpa attention
silently ignores `softcap`, so a softcapping model loaded with sdpa is switched to eager (the
plain forwards of `srt train --steps`). And it marks a model whose logits are not its LM head
applied to the last hidden states (final-logit softcapping, a logit scale), so that srt's
chunked log-prob paths (attention.logprobs, srtcli.train.logprobs) use the full logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from attention.logprobs import POST_HEAD, base_and_head
from srtcli.errors import SrtError

PROBE = "srt_probe"
PROBE_LEN = 12
# Besides what srt's attention implements (dropout, scaling, sliding_window, softcap: `_record`'s
# own parameters), a layer may pass only these, which describe the call: positions are applied
# before attention, by the model, and whether the layer is causal is checked on its mask
DESCRIPTIVE = ("position_ids", "use_cache", "cache_position", "output_attentions", "is_causal")


@dataclass
class _Call:
    mask: torch.Tensor | None
    window: int | None
    softcap: float | None
    extra: list[str] = field(default_factory=list)


# the calls the probe attention records, set only while a probe forward runs (`_probing`)
_CALLS: ContextVar[list[_Call] | None] = ContextVar("srt_probe_calls", default=None)


def _record(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
            softcap=None, **kwargs):
    extra = [k for k, v in kwargs.items() if k not in DESCRIPTIVE and v is not None and v is not False]
    calls = _CALLS.get()
    if calls is not None:
        calls.append(_Call(attention_mask, sliding_window, softcap, extra))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=None, is_causal=query.shape[2] > 1,
        enable_gqa=query.shape[1] != key.shape[1], scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(PROBE, _record)
    AttentionMaskInterface.register(PROBE, eager_mask)  # always a materialised additive mask


@contextmanager
def _probing(model: torch.nn.Module) -> Iterator[list[_Call]]:
    _register()
    cfg = model.config
    saved = cfg._attn_implementation
    cfg._attn_implementation = PROBE
    token = _CALLS.set([])
    try:
        yield _CALLS.get()
    finally:
        _CALLS.reset(token)
        cfg._attn_implementation = saved


def probe_len(model: torch.nn.Module) -> int:
    """PROBE_LEN tokens, or fewer in a model with fewer positions (GPT-2's `n_positions`)."""
    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    return max(1, min(PROBE_LEN, int(limit))) if limit else PROBE_LEN


def _probe_inputs(model: torch.nn.Module) -> dict[str, Any]:
    dev, n = next(model.parameters()).device, probe_len(model)
    vocab = int(getattr(model.config, "vocab_size", 0) or n)
    ids = (torch.arange(n, device=dev) % vocab)[None]
    return {"input_ids": ids, "position_ids": torch.arange(n, device=dev)[None], "use_cache": False}


def causal_visibility(n: int, window: int | None) -> torch.Tensor:
    """[n, n] which keys each query sees in a causal layer with this sliding window."""
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    vis = k <= q
    return vis & ((q - k) < window) if window is not None else vis


def _layers(model: torch.nn.Module) -> int | None:
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(text, "num_hidden_layers", None)


def _check_own_masks(calls: list[_Call], layers: int | None, n: int) -> str | None:
    if not calls or (layers is not None and len(calls) != layers):
        return ("not every layer's attention runs through transformers' attention interface "
                "(some is computed inside the model: ALiBi, linear attention, ...)")
    for i, c in enumerate(calls):
        if c.extra:
            return f"layer {i}'s attention takes {', '.join(f'`{e}`' for e in c.extra)}, which srt does not implement"
        if c.mask is None or c.mask.shape[-2:] != (n, n):
            return f"layer {i} attends without a causal mask (bidirectional?)"
        mask = c.mask.reshape(-1, n, n).cpu()
        seen = mask if mask.dtype == torch.bool else mask == 0
        if not bool((seen == causal_visibility(n, c.window)).all()):
            return (f"layer {i}'s attention mask is not causal with its sliding window "
                    f"({c.window}): bidirectional, chunked or another pattern srt does not implement")
    return None


def _check_given_mask(calls: list[_Call], given: torch.Tensor) -> str | None:
    for i, c in enumerate(calls):
        if c.mask is None or c.mask.shape != given.shape or not torch.equal(c.mask, given):
            return f"layer {i} changes the attention mask it is given (e.g. adds ALiBi or a position bias)"
    return None


def _post_processed(model: torch.nn.Module, logits: torch.Tensor, inputs: dict[str, Any]) -> bool:
    """True unless the logits are exactly the LM head applied to the base model's last states."""
    base, head = base_and_head(model)
    if base is None:
        return True
    states = base(**inputs).last_hidden_state
    return not torch.allclose(head(states).float(), logits.float(), rtol=1e-4, atol=1e-5)


def _own_masks_probe(model: torch.nn.Module) -> tuple[list[_Call], bool]:
    """(each layer's call with the model's own masks, whether its logits are post-processed)."""
    inputs = _probe_inputs(model)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])  # no padding
    with _probing(model) as calls:
        logits = model(**inputs).logits
        own = list(calls)
        post = _post_processed(model, logits, inputs)  # under the same (probe) attention
    return own, post


def _given_mask_probe(model: torch.nn.Module) -> tuple[list[_Call], torch.Tensor]:
    """(each layer's call when the model is given an explicit 4-D additive causal mask, the mask)."""
    inputs = _probe_inputs(model)
    dev = inputs["input_ids"].device
    n = inputs["input_ids"].shape[1]
    given = torch.zeros((1, 1, n, n), dtype=next(model.parameters()).dtype, device=dev)
    given.masked_fill_(~causal_visibility(n, None).to(dev), torch.finfo(given.dtype).min)
    with _probing(model) as calls:
        model(**inputs, attention_mask=given)
        return list(calls), given


def _probing_or_refuse(where: Any, probe, model: torch.nn.Module):
    try:
        return probe(model)
    except Exception as e:  # a model that cannot even run a probe forward cannot run in srt
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SrtError(f"{where}: cannot run the model with explicit positions and masks, as srt does "
                       f"({type(e).__name__}: {first})") from None


@torch.no_grad()
def check_attention(model: torch.nn.Module, where: Any) -> None:
    """Refuse (SrtError naming `where`, one line) a model whose attention srt would not compute
    exactly; switch a softcapping model from sdpa to eager; mark post-processed logits."""
    own, post = _probing_or_refuse(where, _own_masks_probe, model)
    why = _check_own_masks(own, _layers(model), probe_len(model))
    if not why:
        why = _check_given_mask(*_probing_or_refuse(where, _given_mask_probe, model))
    if why:
        raise SrtError(f"{where}: srt cannot run this model exactly: {why}")
    if any(c.softcap is not None for c in own) and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation("eager")  # transformers' sdpa ignores softcap
    setattr(model, POST_HEAD, post)
