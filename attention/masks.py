"""Tree attention masks from the pre-order interval rule, never from a Python loop.

With pre-order layout, token q may attend to token k iff k <= q <= subtree_end[k]: q lies
inside k's subtree and not before k. That one rule gives:

- `sdpa_bool_mask`: a [1, 1, T, T] boolean mask by broadcasting (CPU path: compiled CPU
  FlexAttention has no backward, so CPU training uses SDPA);
- `tree_mask_mod`: a FlexAttention `mask_mod` that reads `subtree_end` per (q, kv) pair, and
  `tree_block_mask`: its BlockMask, built compiled on CUDA so no T x T tensor ever exists;
- `dense_reference_mask`: the slow, obviously-correct mask from the sequences' paths (each path
  is causal over its own tokens), used by the tests to check the others.

`sliding_window` (models such as Mistral, or the sliding layers of Qwen2/Qwen3/Gemma2/Gemma3;
each layer passes its own) is measured in positions (tree depth), as a separate forward would
measure it: key k stays visible to query q iff pos[q] - pos[k] < sliding_window.
"""

from __future__ import annotations

from typing import Callable

import torch


def sdpa_bool_mask(
    subtree_end: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """[1, 1, T, T] bool, True = may attend. Vectorized; T x T booleans (CPU-sized rows)."""
    t = subtree_end.numel()
    idx = torch.arange(t, device=subtree_end.device)
    q, k = idx[:, None], idx[None, :]
    mask = (k <= q) & (q <= subtree_end[None, :])
    if sliding_window is not None and position_ids is not None:
        mask &= (position_ids[:, None] - position_ids[None, :]) < sliding_window
    return mask[None, None]


def tree_roots(subtree_end: torch.Tensor) -> torch.Tensor:
    """[T] packed index of the first token of each token's tree (a pad token is its own tree).

    A token starts a tree when no earlier token's subtree reaches it; every key a query can
    see lies between its tree's start and itself.
    """
    t = subtree_end.numel()
    idx = torch.arange(t, device=subtree_end.device)
    reach = torch.cummax(subtree_end, 0).values  # furthest subtree end among tokens <= i
    starts = torch.ones(t, dtype=torch.bool, device=subtree_end.device)
    starts[1:] = reach[:-1] < idx[1:]
    return torch.cummax(torch.where(starts, idx, torch.zeros_like(idx)), 0).values


def sdpa_blocks(
    subtree_end: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
    block: int = 512,
) -> list[tuple[int, int, slice | torch.Tensor, torch.Tensor]]:
    """The bool mask in query blocks: (q_start, q_end, keys, mask [1, 1, q_end-q_start, len(keys)]).

    `keys` holds only the keys some query of the block can see: those of the block itself, and
    earlier ones whose subtree reaches the block (`subtree_end[k] >= q_start`). Later tokens,
    other trees and earlier sibling branches are skipped, so SDPA never computes them: for K
    branches under a shared prompt, a branch's block reads the prompt and itself, not the other
    branches. `keys` is a slice when it is one contiguous range, else an index tensor."""
    t = subtree_end.numel()
    dev = subtree_end.device
    roots = tree_roots(subtree_end)
    out = []
    for a in range(0, t, block):
        b = min(a + block, t)
        lo = int(roots[a])
        before = torch.nonzero(subtree_end[lo:a] >= a).flatten() + lo
        if before.numel() == a - lo:  # every earlier key of the tree reaches the block
            kidx = torch.arange(lo, b, device=dev)
            keys: slice | torch.Tensor = slice(lo, b)
        else:
            kidx = keys = torch.cat([before, torch.arange(a, b, device=dev)])
        q = torch.arange(a, b, device=dev)[:, None]
        m = (kidx[None, :] <= q) & (q <= subtree_end[kidx][None, :])
        if sliding_window is not None and position_ids is not None:
            m &= (position_ids[a:b, None] - position_ids[None, kidx]) < sliding_window
        out.append((a, b, keys, m[None, None]))
    return out


def tree_mask_mod(
    subtree_end: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> Callable:
    """A FlexAttention mask_mod(b, h, q_idx, kv_idx) for one packed row."""

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx <= subtree_end[kv_idx])

    if sliding_window is None or position_ids is None:
        return mask_mod

    def windowed(b, h, q_idx, kv_idx):
        near = (position_ids[q_idx] - position_ids[kv_idx]) < sliding_window
        return mask_mod(b, h, q_idx, kv_idx) & near

    return windowed


def tree_block_mask(
    subtree_end: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
    compile: bool | None = None,
):
    """The BlockMask of a row (T a multiple of 128 for the fast path). Compiled on CUDA by
    default: uncompiled `create_block_mask` evaluates the full T x T grid."""
    from torch.nn.attention.flex_attention import create_block_mask

    t = subtree_end.numel()
    if compile is None:
        compile = subtree_end.is_cuda
    return create_block_mask(
        tree_mask_mod(subtree_end, position_ids, sliding_window),
        B=None,
        H=None,
        Q_LEN=t,
        KV_LEN=t,
        device=subtree_end.device,
        _compile=compile,
    )


def dense_reference_mask(paths: list[torch.Tensor], total: int) -> torch.Tensor:
    """[T, T] bool from first principles: along every path each token sees its predecessors
    and itself; tokens on no path (padding) see only themselves."""
    mask = torch.zeros(total, total, dtype=torch.bool)
    for path in paths:
        path = path.long()
        n = path.numel()
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        mask[path[:, None], path[None, :]] |= causal
    mask |= torch.eye(total, dtype=torch.bool)
    return mask
