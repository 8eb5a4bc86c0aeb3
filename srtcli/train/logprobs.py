"""Per-sequence log-probs for a micro-batch of work rows, laid out for the loss.

Both paths end in the same `SeqTensors`: one row per training sequence, column t-1 holding
token t's log-prob given tokens < t (t = 1..L-1), next to that token's old log-prob, loss
mask, and the sequence's advantage. The loss (srtcli.train.loss) never knows whether the
log-probs came from a plain causal forward or from a packed tree row.

- plain rows (`--steps`): the steps are right-padded into one [B, L] batch with an attention
  mask, a standard causal forward;
- packed rows (`--shards`): `attention.row_logprobs` runs the tree-masked forward and
  gathers each sequence's log-probs along its path.

Both score softmax(logits / temperature), the rollout's sampling temperature (`TrainData`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from attention.logprobs import head_split

from srtcli.train.data import TrainSeq, WorkRow

CHUNK = 1024  # positions per LM-head chunk: bounds memory at CHUNK x vocab floats


@dataclass
class SeqTensors:
    lp: torch.Tensor  # [n, W] new log-probs (differentiable)
    old: torch.Tensor  # [n, W]
    mask: torch.Tensor  # [n, W] 0/1
    adv: torch.Tensor  # [n]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature) [..., V], computed in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def targets_of(seqs: list[TrainSeq], width: int, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """(old, mask, adv) shifted to predict tokens 1..L-1 and right-padded to `width`."""
    old = torch.zeros(len(seqs), width, dtype=torch.float32)
    mask = torch.zeros(len(seqs), width, dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s) - 1
        if n > 0:
            old[i, :n] = torch.tensor(s.old_logprobs[1:], dtype=torch.float32)
            mask[i, :n] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    return old.to(device), mask.to(device), adv.to(device)


def _score(h: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return token_logprobs(head(h), targets, temperature)


def plain_logprobs(model: torch.nn.Module, seqs: list[TrainSeq], device: torch.device | str,
                   temperature: float = 1.0) -> torch.Tensor:
    """[B, Lmax-1] log-probs of the steps as one right-padded causal batch.

    The LM head runs on real (non-pad) positions only, CHUNK at a time and checkpointed under
    autograd, so [tokens, vocab] logits never exist at once (as in `attention.row_logprobs`);
    models whose logits are not a plain head over the hidden states use the full logits.
    """
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    att = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s.input_ids, dtype=torch.long)
        att[i, : len(s)] = 1
    ids, att = ids.to(device), att.to(device)
    base, head = head_split(model)
    if base is None:
        logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
        return token_logprobs(logits[:, :-1], ids[:, 1:], temperature)
    states = base(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state[:, :-1]
    where = att[:, 1:].bool()
    h, tgt = states[where], ids[:, 1:][where]
    parts = []
    for a in range(0, h.shape[0], CHUNK):
        args = (h[a : a + CHUNK], head, tgt[a : a + CHUNK], temperature)
        parts.append(checkpoint(_score, *args, use_reentrant=False) if h.requires_grad else _score(*args))
    out = states.new_zeros(where.shape, dtype=torch.float32)
    return out.masked_scatter(where, torch.cat(parts)) if parts else out


def packed_logprobs(model: torch.nn.Module, row: object, attn: str, temperature: float = 1.0) -> list[torch.Tensor]:
    """Per-path log-probs of one packed row (tree attention)."""
    from attention import row_logprobs

    return row_logprobs(model, row, backend=attn, temperature=temperature)


def _pad_stack(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    out = []
    for p in parts:
        if p.numel() < width:
            p = torch.cat([p, p.new_zeros(width - p.numel())])
        out.append(p)
    return torch.stack(out)


def micro_logprobs(
    model: torch.nn.Module, rows: list[WorkRow], device: torch.device | str, attn: str, temperature: float = 1.0
) -> tuple[list[TrainSeq], torch.Tensor]:
    """All sequences of a micro-batch and their [n, W] log-probs, in a fixed order."""
    plain = [r.seqs[0] for r in rows if r.packed is None]
    seqs: list[TrainSeq] = []
    parts: list[torch.Tensor] = []
    if plain:
        lp = plain_logprobs(model, plain, device, temperature)
        seqs.extend(plain)
        parts.extend(lp[i, : len(s) - 1] for i, s in enumerate(plain))
    for r in rows:
        if r.packed is not None:
            seqs.extend(r.seqs)
            parts.extend(packed_logprobs(model, r.packed, attn, temperature))
    width = max(max(len(s) - 1 for s in seqs), 1)
    return seqs, _pad_stack(parts, width)


def micro_tensors(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    rows: list[WorkRow],
    device: torch.device | str,
    attn: str,
    temperature: float = 1.0,
) -> tuple[SeqTensors, torch.Tensor | None]:
    """Everything the loss needs for one micro-batch: (policy tensors, reference log-probs),
    both at the rollout's temperature."""
    seqs, lp = micro_logprobs(model, rows, device, attn, temperature)
    ref = None
    if ref_model is not None:
        with torch.no_grad():
            _, ref = micro_logprobs(ref_model, rows, device, attn, temperature)
    old, mask, adv = targets_of(seqs, lp.shape[1], device)
    return SeqTensors(lp, old, mask, adv), ref
