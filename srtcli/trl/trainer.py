"""`PackedGRPOTrainer`: TRL's GRPOTrainer with prefix-tree packed log-prob forwards.

GRPO's K completions of a prompt are consecutive rows of a batch with the same prompt ids. TRL
runs every row in full, padded to the longest one; here the rows of a chunk are stripped of
their padding and laid out as one prefix tree (`attention.rows.pack_rows`: shared prompts and
any shared completion prefix encoded once), each packed row runs once with srt's tree attention
(`attention.hf.tree_attention`, the `srt_tree` attention function; sdpa on CPU, FlexAttention on
CUDA), and each completion token is scored from the hidden state of its parent in the tree with
TRL's own fused LM-head kernel (`trl.kernels.ChunkedLogProbFunction`, same temperature, same
fp32-cast option), so the per-token log-probs and entropies equal TRL's unpacked ones: same
shape [B, logits_to_keep], dtype and zeros on padding.

With `torch_compile=True` the packed forwards run the compiled model's own module eagerly
(`uncompiled`); what falls back to TRL's method stays compiled.

Falls back to TRL's own method (unpacked) for: vision / multimodal inputs and `token_type_ids`,
the MoE aux loss (`compute_aux_loss`), forwards under autograd with reentrant gradient
checkpointing (`use_reentrant=True`: its recomputation cannot be put back inside the tree mask;
the non-reentrant default of TRL and transformers packs, see `_tree_checkpointing`), models
wrapped for distribution (DDP, FSDP, DeepSpeed) or with PEFT adapters, models whose logits are
post-processed (final-logit softcapping, logit scales) or whose LM head is not a plain Linear,
models srt's tree attention does not run exactly
(`srtcli.attention_support.check_attention`), and batches whose rows are not laid out as TRL
lays them out (left-padded prompt, contiguous right-padded completion, non-empty prompt).
"""

from __future__ import annotations

import contextlib
import functools
from contextlib import nullcontext
from typing import Any

import torch
from trl import GRPOTrainer
from trl.kernels import ChunkedLogProbFunction

from attention.hf import recompute_context, resolve_backend, tree_attention
from attention.logprobs import base_and_head, logits_post_processed, parents
from attention.rows import PackedRow, pack_rows

CHUNK_SIZE = 32768  # vocabulary chunk of TRL's fused LM head (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE)
# config fields TRL's fused head reads as a logit multiplier (the packed path leaves such models to TRL)
_SCALES = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def row_attention_inputs(row: PackedRow) -> tuple[torch.Tensor, torch.Tensor]:
    """(subtree_end, position_ids) that `tree_attention` applies to a packed row: the tree's
    interval mask and tree depths (one place, so tests can break it on purpose)."""
    return row.subtree_end, row.position_ids


def real_spans(attention_mask: torch.Tensor, logits_to_keep: int) -> list[tuple[int, int]] | None:
    """Per row, the [start, end) columns of its real tokens, or None if some row is not laid out
    as TRL lays it out: one contiguous run of ones (left-padded prompt, right-padded completion)
    that starts before the completion columns."""
    m = attention_mask.detach().to("cpu", torch.int64)
    width = m.shape[1]
    first_completion = width - logits_to_keep
    spans = []
    for row in m:
        idx = torch.nonzero(row).flatten()
        if idx.numel() == 0:
            return None
        s, e = int(idx[0]), int(idx[-1]) + 1
        if e - s != idx.numel() or s >= first_completion:
            return None
        spans.append((s, e))
    return spans


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module `torch.compile` wrapped (TRL's `torch_compile=True`), or `model` itself. Packed
    forwards run it eagerly: a packed row's length changes with every batch (each would compile
    anew) and the row's tree mask is read from a context variable inside the attention call."""
    return model._orig_mod if isinstance(model, torch._dynamo.eval_frame.OptimizedModule) else model


def _checkpoint_funcs(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Any]]:
    """The modules that checkpoint their forward under autograd, with their checkpoint function
    (transformers' gradient checkpointing)."""
    if not (torch.is_grad_enabled() and getattr(model, "is_gradient_checkpointing", False)):
        return []
    return [(m, m._gradient_checkpointing_func) for m in model.modules()
            if getattr(m, "gradient_checkpointing", False) and getattr(m, "_gradient_checkpointing_func", None)]


def _checkpointing_ok(model: torch.nn.Module) -> bool:
    """Whether a packed forward can run with the model's gradient checkpointing: none active, or
    non-reentrant `torch.utils.checkpoint` (transformers' and TRL's default), which takes a
    `context_fn` that puts the tree mask back around the backward's recomputation."""
    for _, fn in _checkpoint_funcs(model):
        kw = getattr(fn, "keywords", None)
        if kw is None or kw.get("use_reentrant") is not False or "context_fn" in kw:
            return False
    return True


@contextlib.contextmanager
def _tree_checkpointing(model):
    """While a packed row runs forward, every checkpointed layer recomputes (in the backward)
    inside the same row's tree attention (`attention.hf.recompute_context`); without this the
    recomputation would run the plain mask and differ from the forward."""
    saved = _checkpoint_funcs(model)
    try:
        for m, fn in saved:
            m._gradient_checkpointing_func = functools.partial(fn, context_fn=recompute_context)
        yield
    finally:
        for m, fn in saved:
            m._gradient_checkpointing_func = fn


def completion_slots(row: PackedRow, spans, first: int, logits_to_keep: int):
    """(packed indices of the completion tokens a row holds, their flat [B * logits_to_keep]
    slots in TRL's output), or None if it holds none; `spans[i]` is row i's (start, end) of real
    tokens in the batch and `first` the batch column of the first completion token."""
    children, slots = [], []
    for path, sid in zip(row.paths, row.seq_ids):
        s, e = spans[sid]
        lo = max(first, s + 1)
        if lo < e:
            children.append(path[lo - s : e - s])
            slots.append(torch.arange(lo - first, e - first) + sid * logits_to_keep)
    return (torch.cat(children), torch.cat(slots)) if children else None


class PackedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose log-prob forwards (policy, old policy, reference) run as prefix trees.

    `srt_attn`: tree attention backend (auto|sdpa|flex|eager; auto = flex on CUDA, sdpa
    elsewhere); `srt_max_tokens`: real tokens per packed row (a longer sequence gets a row of
    its own). `srt_stats` holds the token counts of the last packed call: `packed_tokens` (tokens
    run) and `padded_tokens` (what TRL's padded forward would run)."""

    def __init__(self, *args: Any, srt_attn: str = "auto", srt_max_tokens: int = 8192, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.srt_attn = srt_attn
        self.srt_max_tokens = srt_max_tokens
        self.srt_stats: dict[str, int] = {}
        self._srt_supported: dict[int, bool] = {}

    # -- when to pack ------------------------------------------------------------------
    def _srt_model_ok(self, model: torch.nn.Module) -> bool:
        key = id(model)
        if key not in self._srt_supported:
            self._srt_supported[key] = self._srt_check(model)
        return self._srt_supported[key]

    def _srt_check(self, model: torch.nn.Module) -> bool:
        from transformers import PreTrainedModel

        if not isinstance(model, PreTrainedModel):  # DDP / FSDP1 / DeepSpeed wrappers, PEFT models
            return False
        if any(type(p).__name__ == "DTensor" for p in model.parameters()):  # FSDP2
            return False
        config = model.config.get_text_config()
        if logits_post_processed(model) or any(getattr(config, f, None) is not None for f in _SCALES):
            return False
        base, _head = base_and_head(model)
        if base is None:
            return False
        from srtcli.attention_support import check_attention
        from srtcli.errors import SrtError

        try:
            check_attention(model, "PackedGRPOTrainer")
        except SrtError:
            return False
        return not logits_post_processed(model)  # check_attention marks models it finds post-processed

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal,
                                           ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's contract: ([B, logits_to_keep] log-probs of the completion tokens, zero on padding;
        the entropies likewise when `compute_entropy`, else None; the MoE aux loss or None)."""
        spans = None  # TRL passes the multimodal inputs (pixel_values, num_images, ...) by keyword
        plain_inputs = not compute_aux_loss and all(v is None for v in multimodal.values())
        eager = uncompiled(model)
        if plain_inputs and self._srt_model_ok(eager) and _checkpointing_ok(eager):
            spans = real_spans(attention_mask, logits_to_keep)
        if spans is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        batch_size = batch_size or input_ids.size(0)
        logps, ents = [], []
        packed = 0
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            lp, ent, n = self._packed_chunk(eager, input_ids[start:end], spans[start:end], logits_to_keep,
                                            compute_entropy)
            logps.append(lp)
            ents.append(ent)
            packed += n
        self.srt_stats = {"packed_tokens": packed, "padded_tokens": int(input_ids.numel()),
                          "grad": torch.is_grad_enabled()}
        return torch.cat(logps, 0), (torch.cat(ents, 0) if compute_entropy else None), None

    # -- one chunk ---------------------------------------------------------------------
    def _packed_chunk(self, model, input_ids, spans, logits_to_keep: int, compute_entropy: bool):
        """([B, logits_to_keep] log-probs, entropies or None, packed tokens run) of one chunk."""
        device = input_ids.device
        b, width = input_ids.shape
        ids_cpu = input_ids.detach().cpu()
        seqs = [ids_cpu[i, s:e] for i, (s, e) in enumerate(spans)]
        backend = resolve_backend(self.srt_attn, device)
        rows = pack_rows([seqs], max_tokens=max(self.srt_max_tokens, max(len(s) for s in seqs)),
                         pad_to=128 if backend == "flex" else 1)
        outputs = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
        lp_out = ent_out = None
        for row in rows:
            found = completion_slots(row, spans, width - logits_to_keep, logits_to_keep)
            if found is None:
                continue
            child, slot = found
            lp, ent = self._row_scores(model, row, child, backend, outputs)
            if lp_out is None:
                lp_out = lp.new_zeros(b * logits_to_keep)
                ent_out = lp.new_zeros(b * logits_to_keep) if compute_entropy else None
            lp_out = lp_out.index_put((slot.to(device),), lp)
            if compute_entropy:
                ent_out = ent_out.index_put((slot.to(device),), ent)
        if lp_out is None:  # nothing scored in the chunk: TRL's zeros, still attached to the model
            zero = next(model.parameters()).sum() * 0.0
            lp_out = zero.float().expand(b * logits_to_keep).clone()
            ent_out = lp_out.detach().clone() if compute_entropy else None
        return (lp_out.view(b, logits_to_keep), ent_out.view(b, logits_to_keep) if compute_entropy else None,
                sum(r.n_real for r in rows))

    def _row_scores(self, model, row: PackedRow, child: torch.Tensor, backend: str, outputs: tuple):
        """The log-probs (and entropies, or None) of the packed tokens `child` of one row: one
        tree-attention forward, each token scored from its parent's hidden state. Every packed
        token has one parent, so a child index names one (parent, token) pair: each is scored once."""
        device = next(model.parameters()).device
        base, head = base_and_head(model)
        uniq, inverse = torch.unique(child, return_inverse=True)
        parent = parents(row)[uniq]
        subtree_end, position_ids = row_attention_inputs(row)
        with self.accelerator.autocast():  # as TRL runs its fused forward
            with tree_attention(model, subtree_end, position_ids, backend), \
                    _tree_checkpointing(model):
                hidden = base(input_ids=row.input_ids.to(device)[None],
                              position_ids=position_ids.to(device)[None], use_cache=False).last_hidden_state[0]
            h = hidden.index_select(0, parent.to(device)).to(head.weight.device)
            lp, ent = self._score(h, head, row.input_ids[uniq].to(h.device), outputs)
        inv = inverse.to(lp.device)
        return lp[inv], (ent[inv] if ent is not None else None)

    def _score(self, hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, outputs):
        """TRL's fused LM-head scoring, called as its fused forward calls it."""
        ctx = nullcontext()
        if self.args.cast_lm_head_to_fp32:
            hidden = hidden.float()
            ctx = torch.autocast(hidden.device.type, enabled=False)
        with ctx:
            lp, ent, *_ = ChunkedLogProbFunction.apply(
                hidden, head.weight, head.bias, targets, self.temperature, CHUNK_SIZE, None, 1.0, outputs)
        return lp, ent
