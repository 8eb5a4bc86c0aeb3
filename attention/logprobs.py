"""Per-sequence log-probs (and entropies) from one forward of a packed row.

In a tree every packed token has exactly one parent (the token before it on every path
through it), so the distinct (position, next token) pairs of all sequences are exactly the
(parent[t], t) pairs: a branch point's last logit serves the first token of every child, and a
shared prefix is scored once. We take the model's last hidden states, and, per chunk of
distinct parent positions, apply the LM head, a float32 log-sum-exp (and entropy), and pick
each child's token. Under autograd each chunk is checkpointed, so the [T, vocab] logits are
never held at once, in the forward or the backward. Every sequence's values are then gathered
along its path; everything is differentiable w.r.t. the model's parameters.

With `temperature` T the log-probs (and entropies) are those of softmax(logits / T): the
distribution a rollout sampled at temperature T drew its tokens from, as RL trainers score them.

Models whose LM head is not a plain Linear (or that post-process logits: final-logit
softcapping, a logit scale; srt's loaders find it from the model and set `POST_HEAD` on it) fall
back to the model's full logits, still scored once per distinct pair.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from attention.hf import resolve_backend, tree_attention
from attention.rows import PackedRow, pack_rows

CHUNK = 1024  # parent positions per LM-head chunk: bounds memory at CHUNK x vocab floats
# a model attribute: True when its logits are not its LM head applied to the last hidden states
POST_HEAD = "_srt_logits_post_processed"


def logits_post_processed(model: torch.nn.Module) -> bool:
    """Whether `model`'s logits are more than head(last hidden states): as found when srt
    loaded it (POST_HEAD), else from the config's known post-processing settings."""
    config = model.config
    named = getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
    return bool(getattr(model, POST_HEAD, False) or named)


def base_and_head(model: torch.nn.Module):
    """(base model, LM head) of a causal LM whose head is a plain Linear on the base model's
    last hidden states, else (None, None)."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if base is None or base is model or not isinstance(head, torch.nn.Linear):
        return None, None
    return base, head


def head_split(model: torch.nn.Module):
    """(base model, head) to score hidden states chunk by chunk, or (None, None) if unsafe."""
    return (None, None) if logits_post_processed(model) else base_and_head(model)


def _score_chunk(h: torch.Tensor, head, local: torch.Tensor, tok: torch.Tensor, want_ent: bool,
                 temperature: float = 1.0):
    logits = (head(h) if head is not None else h).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits[local, tok] - lse[local]
    if want_ent:
        ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    else:
        ent = lse.new_zeros(0)
    return picked, ent


def parents(row: PackedRow) -> torch.Tensor:
    """[n_real] the packed index of each token's parent in the tree (-1 at roots and at tokens
    on no path): the token whose hidden state predicts it."""
    parent = torch.full((row.n_real,), -1, dtype=torch.int64)
    for path in row.paths:
        if path.numel() > 1:
            parent[path[1:]] = path[:-1]
    return parent


def _pairs(row: PackedRow) -> tuple[torch.Tensor, torch.Tensor]:
    """(dst, parent) of every non-root packed token on some path, sorted by parent."""
    parent = parents(row)
    dst = torch.nonzero(parent >= 0).flatten()
    src = parent[dst]
    order = torch.argsort(src, stable=True)
    return dst[order], src[order]


def _row_states(model: torch.nn.Module, row: PackedRow, backend: str) -> tuple[torch.Tensor, Any]:
    """One tree-attention forward of the whole row: the final hidden states and the LM head
    that scores them, or the full logits and no head for models that post-process logits."""
    device = next(model.parameters()).device
    ids = row.input_ids.to(device)[None]
    pos = row.position_ids.to(device)[None]
    base, head = head_split(model)
    with tree_attention(model, row.subtree_end, row.position_ids, backend):
        if base is not None:
            return base(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state[0], head
        return model(input_ids=ids, position_ids=pos, use_cache=False).logits[0], head


def row_logprobs(
    model: torch.nn.Module,
    row: PackedRow,
    entropy: bool = False,
    backend: str = "auto",
    chunk_size: int = CHUNK,
    temperature: float = 1.0,
):
    """Per path of `row`: log-probs of its tokens 1..L-1 given the prefix (1-D float32), under
    softmax(logits / temperature).

    One forward of the whole row. With `entropy=True` returns `(logprobs, entropies)`, where
    entropies[i][j] is the entropy of the distribution that predicts token j+1.
    """
    device = next(model.parameters()).device
    states, head = _row_states(model, row, backend)
    dst, src = _pairs(row)
    uniq, local_all = torch.unique_consecutive(src, return_inverse=True)
    tok_all = row.input_ids[dst]
    picked, ents = [], []
    bounds = torch.searchsorted(local_all, torch.arange(0, uniq.numel() + chunk_size, chunk_size))
    for c, start in enumerate(range(0, uniq.numel(), chunk_size)):
        a, b = int(bounds[c]), int(bounds[c + 1])
        h = states[uniq[start : start + chunk_size].to(device)]
        args = (h, head, (local_all[a:b] - start).to(device), tok_all[a:b].to(device), entropy, temperature)
        if torch.is_grad_enabled() and h.requires_grad:
            p, e = checkpoint(_score_chunk, *args, use_reentrant=False)
        else:
            p, e = _score_chunk(*args)
        picked.append(p)
        ents.append(e)
    lp_flat = torch.cat(picked) if picked else states.new_zeros(0, dtype=torch.float32)
    slot = torch.full((max(row.n_real, 1),), -1, dtype=torch.int64)
    slot[dst] = torch.arange(dst.numel())  # packed index -> its place in lp_flat
    out = [lp_flat[slot[p[1:]].to(device)] for p in row.paths]
    if not entropy:
        return out
    ent_flat = torch.cat(ents) if ents else lp_flat.new_zeros(0)
    rank = torch.full((max(row.n_real, 1),), -1, dtype=torch.int64)
    rank[uniq] = torch.arange(uniq.numel())  # parent position -> its place in ent_flat
    return out, [ent_flat[rank[p[:-1]].to(device)] for p in row.paths]


def tree_logprobs(
    model: torch.nn.Module,
    sequences: list[list[int]],
    max_tokens: int = 8192,
    backend: str = "auto",
    entropy: bool = False,
    pad_to: int | None = None,
):
    """Log-probs of tokens 1..L-1 of every sequence, in input order, via packed forwards.

    The sequences form one tree (split into rows of <= max_tokens when it is larger);
    one forward per row. `pad_to` defaults to 128 for flex, none otherwise.
    """
    device = next(model.parameters()).device
    chosen = resolve_backend(backend, device)
    if pad_to is None:
        pad_to = 128 if chosen == "flex" else 1
    rows = pack_rows([sequences], max_tokens=max_tokens, pad_to=pad_to)
    lps: list[torch.Tensor | None] = [None] * len(sequences)
    ents: list[torch.Tensor | None] = [None] * len(sequences)
    for row in rows:
        res = row_logprobs(model, row, entropy=entropy, backend=chosen)
        row_lps, row_ents = res if entropy else (res, None)
        for i, sid in enumerate(row.seq_ids):
            lps[sid] = row_lps[i]
            if row_ents is not None:
                ents[sid] = row_ents[i]
    return (lps, ents) if entropy else lps
