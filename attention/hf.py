"""Run a packed row through any transformers causal LM with standard attention, unmodified.

transformers (5.x) attention modules call the function registered under
`config._attn_implementation` in `AttentionInterface`, and build masks with the function of the
same name in `AttentionMaskInterface`. We register one name, `srt_tree`, in both:

- the attention function applies the *current row's* tree mask (set by the `tree_attention`
  context manager) with the chosen backend: `sdpa` (boolean masks per query block, keys
  limited to the block's tree and causal range; the CPU path), `flex`
  (FlexAttention with a BlockMask; compiled on CUDA), or `eager` (explicit softmax; reference);
- the mask function returns no mask while a row is active (the tree mask replaces it, and
  transformers would otherwise build a T x T "packed sequence" mask from our position ids),
  and the ordinary SDPA mask otherwise.

Per layer, as transformers defines it: the layer's `sliding_window` (None on full-attention
layers) is measured in positions, i.e. tree depth (masks cached per window value), and its
`softcap` (attention logit softcapping) is applied by every backend (sdpa: that block computed
explicitly, since SDPA cannot softcap; flex: a `score_mod`). Attention sinks and position
biases are not implemented: srt refuses such models when it loads them, and the attention
function raises rather than drop them.

Outside a row, `srt_tree` behaves exactly like `sdpa`, and `tree_attention` restores the
model's own implementation on exit, so ordinary inputs always take the ordinary path.
Masks are built once per row (and window) and shared by the layers. Under gradient
checkpointing a layer runs again in the backward, outside the block: `recompute_context` puts
the row back around that recomputation (`attention.checkpointing`, and TRL's checkpointing in
srt's trainer).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

NAME = "srt_tree"
BACKENDS = ("auto", "sdpa", "flex", "eager")
SDPA_BLOCK = 128  # query block of the sdpa backend (see masks.sdpa_blocks; 128 measured fastest of 128-512)
# attention arguments some models pass that the tree backends do not implement (srt refuses
# such models when it loads them, srtcli.attention_support; this is the last line of defence)
_UNSUPPORTED = ("s_aux", "sinks", "position_bias")


@dataclass
class _Row:
    subtree_end: torch.Tensor
    position_ids: torch.Tensor
    backend: str
    config: Any  # the model config whose attention implementation names `srt_tree` while active
    cache: dict[Any, Any] = field(default_factory=dict)  # (kind, window) -> mask, per row

    def bool_mask(self, window: int | None) -> torch.Tensor:
        from attention.masks import sdpa_bool_mask

        key = ("bool", window)
        if key not in self.cache:
            self.cache[key] = sdpa_bool_mask(self.subtree_end, self.position_ids, window)
        return self.cache[key]

    def blocks(self, window: int | None):
        from attention.masks import sdpa_blocks

        key = ("blocks", window, SDPA_BLOCK)
        if key not in self.cache:
            self.cache[key] = sdpa_blocks(self.subtree_end, self.position_ids, window, SDPA_BLOCK)
        return self.cache[key]

    def block_mask(self, window: int | None):
        from attention.masks import tree_block_mask

        key = ("block", window)
        if key not in self.cache:
            self.cache[key] = tree_block_mask(self.subtree_end, self.position_ids, window)
        return self.cache[key]


_ACTIVE: contextvars.ContextVar[_Row | None] = contextvars.ContextVar("srt_tree_row", default=None)
_registered = False
_compiled_flex = None


def resolve_backend(backend: str, device: torch.device | str | None = None) -> str:
    """Map `--attn auto|sdpa|flex|eager` to a backend: auto = flex on CUDA, sdpa elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend != "auto":
        return backend
    return "flex" if torch.device(device or "cpu").type == "cuda" else "sdpa"


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def _flex(query, key, value, block_mask, scale, softcap=None):
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    score_mod = None
    if softcap is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / softcap) * softcap

    if query.is_cuda:  # fused kernel; eager flex would materialise the scores
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=True)
        fn = _compiled_flex
    else:  # CPU: eager flex, forward only (no CPU flex backward in torch); checks the mask_mod
        fn = flex_attention
    return fn(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=True)


def _keys(x: torch.Tensor, keys: slice | torch.Tensor) -> torch.Tensor:
    """x[:, :, keys]: a view for a contiguous range, a gather for a key list."""
    return x[:, :, keys] if isinstance(keys, slice) else x.index_select(2, keys)


def explicit_attention(query, key, value, mask, scaling=None, softcap=None, dropout=0.0, training=False):
    """Attention computed as transformers' eager attention does: scores * scaling, then
    softcap * tanh(scores / softcap) if the layer softcaps, then the mask (bool, True = seen,
    or additive), a float32 softmax; grouped KV heads repeated. SDPA cannot softcap, so every
    softcapping layer (here and in the rollout engine) takes this path.
    Returns (output [B, H, q, D], weights)."""
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=training)
    return torch.matmul(weights, value), weights


def _sdpa_block(module, query, key, value, mask, dropout, scaling, softcap):
    if softcap is not None:  # SDPA cannot softcap: the same block, computed explicitly
        return explicit_attention(query, key, value, mask, scaling, softcap, dropout, module.training)[0]
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)


class BlockedAttention(torch.autograd.Function):
    """Attention of a row's query blocks (`masks.sdpa_blocks`), with a backward that writes each
    block's gradients into one buffer per input.

    Autograd's own backward of the blocked forward gives every block's query slice and key
    gather a zero tensor the size of the whole row, and then sums them: memory traffic that
    grows with the square of the row's length, on every layer (on SmolLM2-135M it made a packed
    token cost 1.2x a padded one in 7k-token rows). Here the backward recomputes each block's
    attention from the saved inputs (SDPA keeps nothing between blocks) and adds its gradients
    in place. `block(q, k, v, mask)` is the attention of one block; it must be deterministic."""

    @staticmethod
    def forward(ctx, query, key, value, block, blocks):
        ctx.block, ctx.blocks = block, blocks
        ctx.save_for_backward(query, key, value)
        return blocked_attention(query, key, value, block, blocks)

    @staticmethod
    def backward(ctx, grad):
        query, key, value = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        for a, b, ks, m in ctx.blocks:
            with torch.enable_grad():
                q = query[:, :, a:b].detach().requires_grad_()
                k = _keys(key, ks).detach().requires_grad_()
                v = _keys(value, ks).detach().requires_grad_()
                gq, gk, gv = torch.autograd.grad(ctx.block(q, k, v, m), (q, k, v), grad[:, :, a:b])
            dq[:, :, a:b] = gq
            _add_keys(dk, ks, gk)
            _add_keys(dv, ks, gv)
        return dq, dk, dv, None, None


def blocked_attention(query, key, value, block, blocks) -> torch.Tensor:
    """Each query block's attention over its keys, concatenated along the positions."""
    outs = [block(query[:, :, a:b], _keys(key, ks), _keys(value, ks), m) for a, b, ks, m in blocks]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _add_keys(total: torch.Tensor, keys: slice | torch.Tensor, grad: torch.Tensor) -> None:
    if isinstance(keys, slice):
        total[:, :, keys] += grad
    else:
        total.index_add_(2, keys, grad)


def _tree_forward(row: _Row, module, query, key, value, dropout, scaling, window, softcap=None):
    """query [B, H, T, D], key/value [B, Hkv, T, D] -> [B, T, H, D]. `window`: the layer's
    sliding window (in positions); `softcap`: its attention logit softcapping."""
    groups = query.shape[1] // key.shape[1]
    if row.backend == "flex":
        if dropout:
            raise ValueError("the flex tree backend does not support attention dropout")
        out = _flex(query, key, value, row.block_mask(window), scaling, softcap)
        return out.transpose(1, 2).contiguous(), None
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    if row.backend == "sdpa":
        def block(q, k, v, mask):
            return _sdpa_block(module, q, k, v, mask, dropout, scaling, softcap)

        blocks = row.blocks(window)
        if dropout and module.training:  # a recomputed block would draw other dropout masks
            out = blocked_attention(query, key, value, block, blocks)
        else:
            out = BlockedAttention.apply(query, key, value, block, blocks)
        return out.transpose(1, 2).contiguous(), None
    out, weights = explicit_attention(query, key, value, row.bool_mask(window), scaling, softcap, dropout,
                                      module.training)
    return out.transpose(1, 2).contiguous(), weights


def srt_tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The registered attention function: tree mask inside a row, plain SDPA outside."""
    query, key, value = one_dtype(query, key, value)
    row = _ACTIVE.get()
    if row is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1 or query.shape[2] != row.subtree_end.numel():
        raise ValueError("a tree row runs as one sequence of batch size 1, without a KV cache")
    for name in _UNSUPPORTED:  # silently dropping these would break exactness
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"tree attention does not support `{name}` (used by this model)")
    return _tree_forward(row, module, query, key, value, dropout, scaling, sliding_window, softcap)


def one_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k and v in one dtype. Under autocast the rotary embedding leaves q and k in the
    weights' float32 beside a bf16 v, and SDPA takes one dtype: the autocast dtype then, as
    CUDA's autocast casts SDPA's inputs (a CPU's does not)."""
    if query.dtype == key.dtype == value.dtype:
        return query, key, value
    kind = query.device.type
    target = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else \
        torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    return query.to(target), key.to(target), value.to(target)


def _srt_tree_mask(*args: Any, **kwargs: Any):
    """The registered mask function: none inside a row (the tree mask replaces it)."""
    if _ACTIVE.get() is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Register `srt_tree` with transformers (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, srt_tree_attention)
    AttentionMaskInterface.register(NAME, _srt_tree_mask)
    _registered = True


@contextlib.contextmanager
def tree_attention(
    model: torch.nn.Module,
    subtree_end: torch.Tensor,
    position_ids: torch.Tensor,
    backend: str = "auto",
) -> Iterator[None]:
    """Within the block, `model` attends with the tree mask of one packed row.

    `subtree_end`/`position_ids` are the row's [T] tensors (moved to the model's device).
    The model's attention implementation is restored on exit.
    """
    register()
    device = next(model.parameters()).device
    row = _Row(subtree_end.to(device), position_ids.to(device), resolve_backend(backend, device), model.config)
    with _active(row):
        yield


@contextlib.contextmanager
def _active(row: _Row) -> Iterator[None]:
    saved = row.config._attn_implementation
    row.config._attn_implementation = NAME
    token = _ACTIVE.set(row)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        row.config._attn_implementation = saved


def recompute_context() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """`context_fn` for non-reentrant `torch.utils.checkpoint`: (forward, recompute) contexts.

    A layer checkpointed inside a row is recomputed during the backward, after `tree_attention`
    has exited; without this it would attend over the whole packed row with the plain causal
    rule and the gradients would be silently wrong. The recompute re-enters the row the forward
    ran with (captured now, at the forward), so it attends exactly as the forward did."""
    row = _ACTIVE.get()
    return contextlib.nullcontext(), (_active(row) if row is not None else contextlib.nullcontext())
