"""How one engine step's rows become one model forward (`ForwardPass`, held by the engine): the
packed and the padded layouts, the attention mask, and the call into the model with the
engine's slot cache and attention.

Each row's input is its pending tokens followed by its draft; the result is the shaped target
distribution p[r, k] after the pending tokens and k draft tokens, for every k verification
needs. Which layout runs, and why:

- Packed (`ForwardPass.run`), when left-padding would add at least `PACK_MIN_PADDING` tokens,
  or when a row carries a draft tree: the model runs on the real tokens of all rows concatenated
  ([1, T], per-token `position_ids`), so its linear layers and the LM head spend nothing on
  padding; only attention (`srtcli.rollout.engine.kv_cache.slot_attention`) lays the queries
  out per row. Tree rows get depth positions and ancestor-only masks
  (`srtcli.rollout.engine.tree_verify.mask_trees`).
  Sliding-window layers narrow the mask by the positions of queries and keys
  (`packed_positions`: a tree node's is its depth, not its cache column).
- Padded (`_forward_padded`): rows left-padded to one length, padding writing to the cache's
  trash column; plain decode steps (one token per row), and every forward of attention
  implementations we do not replace (e.g. flash).

Both give bit-identical outputs.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from srtcli.models import cache_keyword
from srtcli.rollout.engine.host_tensors import longs
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import EngineStats
from srtcli.rollout.engine.kv_cache import Layout, Packed, SlotKVCache, Windows, layout, packed_attention
from srtcli.rollout.engine.target import Target
from srtcli.rollout.engine.tree_verify import mask_trees

# Pack a forward only when left-padding would add at least this many tokens: below it, the
# packing bookkeeping (index maps, gathers in every attention call) costs more than the padded
# tokens' FLOPs (measured on the bundled model, CPU: batch-8 decode got slower).
PACK_MIN_PADDING = 16


class ForwardPass:
    """The engine's forward passes over its `slots`-slot cache, timed into `stats`. The model
    runs with our `srt_slots` attention only if it was loaded with sdpa or eager (it is put
    back after each forward); any other attention takes the padded path."""

    def __init__(self, model: torch.nn.Module, params: SamplingParams, kv_cache: SlotKVCache, slots: int,
                 device: torch.device, dtype: torch.dtype, max_len: int, stats: EngineStats):
        self.model, self.params, self.kv_cache, self.slots = model, params, kv_cache, slots
        self.device, self.dtype, self.max_len, self.stats = device, dtype, max_len, stats
        self.attn = "srt_slots" if model.config._attn_implementation in ("sdpa", "eager") else None
        self.cache_keyword = cache_keyword(model)

    def run(self, rows: list[Any], props: list[Any]) -> Target:
        """One forward of pending + draft tokens for `rows`; the target distributions after the
        row's pending tokens and each of its draft tokens (`Target.at(r, k)`, k <= len(draft_r))."""
        inputs = [s.tokens[s.cache_len:] + pr.tokens for s, pr in zip(rows, props)]
        lens = [len(x) for x in inputs]
        dls = [len(pr.tokens) for pr in props]
        b, dev = len(rows), self.device
        trees = any(pr.parents is not None for pr in props)
        if trees and self.attn is None:
            raise ValueError("tree drafts need the model's sdpa or eager attention (srt_slots replaces it)")
        if self.attn is None or (not trees and b * max(lens) - sum(lens) < PACK_MIN_PADDING):
            return self._forward_padded(rows, inputs, dls)
        # Packed: the model runs on the T real tokens only ([1, T]); our attention function
        # lays the queries out per attention row. With at least half the slots live, the
        # attention rows are all slots (reads of the cache are views, not gathers; a slot not
        # in this forward is an all-padding row).
        nslots = self.slots
        arow = [s.slot for s in rows] if 2 * b >= nslots else list(range(b))
        na = nslots if 2 * b >= nslots else b
        lay = layout(lens, [s.cache_len for s in rows], arow, na, split=dev.type == "cpu")
        mask = self._mask(lay.pos, lay.lcur)
        posids = lay.flat
        if trees:
            trees_rows = [(len(q.tokens) - q.cache_len, q.cache_len, pr.parents) for q, pr in zip(rows, props)]
            posids = mask_trees(trees_rows, lay, arow, mask)
        slot_idx = longs([s.slot for s in rows])
        read = torch.arange(nslots) if na == nslots else slot_idx
        self.kv_cache.prepare(read.to(dev), slot_idx[lay.tok_row][None].to(dev), lay.flat[None].to(dev),
                           lay.lcur, na == nslots)
        ids = longs([t for x in inputs for t in x])[None]
        windows = Windows(lambda: packed_positions(lay, posids, arow, na))
        logits = self._model_forward(ids, posids[None], mask, kept_logits(lens, dls),
                                     lay.packed(), rows, windows)[0]
        return Target(logits, kept_starts(dls), self.params)

    def _forward_padded(self, rows: list[Any], inputs: list[list[int]], dls: list[int]) -> Target:
        """Rows left-padded to a common length, padding writes to the trash column: for
        attention implementations we do not replace (e.g. flash), and for forwards with little
        padding (`PACK_MIN_PADDING`), e.g. plain decode steps where every row carries one token."""
        lens = [len(x) for x in inputs]
        b, q, keep, dev = len(rows), max(lens), max(dls) + 1, self.device
        starts = [s.cache_len for s in rows]
        lcur = max(c + n for c, n in zip(starts, lens))
        pos, widx, ids = [], [], []
        for c, n, x in zip(starts, lens, inputs):
            cols = range(c, c + n)
            pos += [0] * (q - n) + list(cols)
            widx += [self.max_len] * (q - n) + list(cols)  # padding writes to the trash column
            ids += [0] * (q - n) + x
        pos_t, widx, ids_t = (longs(v).view(b, q) for v in (pos, widx, ids))
        mask = self._mask(pos_t, lcur)
        slots = [s.slot for s in rows]
        slot_idx = longs(slots)
        self.kv_cache.prepare(slot_idx.to(dev), slot_idx[:, None].expand(b, q).to(dev), widx.to(dev), lcur,
                           slots == list(range(self.slots)))
        windows = Windows(lambda: (pos_t, torch.arange(lcur).expand(b, lcur)))
        out = self._model_forward(ids_t, pos_t, mask, keep, None, rows, windows)
        # row r's needed logits are the last len(draft_r) + 1 of the kept ones
        idx = longs([r * keep + keep - 1 - d + k for r, d in enumerate(dls) for k in range(d + 1)]).to(dev)
        return Target(out.reshape(b * keep, -1).index_select(0, idx), kept_starts(dls), self.params)

    def _mask(self, pos: torch.Tensor, lcur: int) -> torch.Tensor:
        """Additive [b, 1, q, lcur] mask: a query sees its own row's positions up to its own. A
        padding query sits at position 0 in both layouts, so it sees column 0 only (its output
        is discarded)."""
        vis = self._visible(pos, torch.arange(lcur))
        mask = torch.zeros((pos.shape[0], 1, pos.shape[1], lcur), dtype=self.dtype)
        return mask.masked_fill_(~vis[:, None], torch.finfo(self.dtype).min)

    def _model_forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, keep: Any,
                       packed: Packed | None, rows: list[Any], windows: Windows | None = None) -> torch.Tensor:
        """Run the model with our cache and attention; returns the kept logits. `windows`
        gives sliding-window layers the positions their narrower masks derive from."""
        cfg = self.model.config
        saved = cfg._attn_implementation
        if self.attn:
            cfg._attn_implementation = self.attn
        dev = self.device
        if packed is not None:
            packed = packed.to(dev)
            keep = keep.to(dev)
        t0 = time.perf_counter()
        try:
            with packed_attention(packed, windows):
                out = self._call_model(
                    input_ids=ids.to(dev), position_ids=pos.to(dev), attention_mask=mask.to(dev),
                    **{self.cache_keyword: self.kv_cache}, use_cache=True, logits_to_keep=keep,
                )
        finally:
            cfg._attn_implementation = saved
        if dev.type == "cuda":  # the host syncs at the next .tolist() anyway: time the GPU work here
            torch.cuda.synchronize(dev)
        self.stats.model_s += time.perf_counter() - t0
        self.stats.all_forwards += 1
        if any(not s.runahead for s in rows):
            self.stats.forwards += 1
        return out.logits

    @torch.inference_mode()
    def _call_model(self, **kw: Any) -> Any:
        return self.model(**kw)

    @staticmethod
    def _visible(pos: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """[b, q, lcur] which cache columns each query sees: its own row's positions up to its
        own. Columns past a row's valid length (rejected drafts, other rows' padding) hide."""
        return keys[None, None, :] <= pos[:, :, None]


def packed_positions(lay: Layout, posids: torch.Tensor, arow: list[int], na: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([na, q] query positions, [na, lcur] key positions) of a packed forward: a cache column
    holds the token of its own position, except the columns this forward writes, which hold
    tokens at `posids` (a tree node sits at the position of its depth, not of its column)."""
    qpos = lay.pos.clone().view(-1)
    qpos[lay.scatter] = posids
    kpos = torch.arange(lay.lcur).repeat(na, 1)
    kpos[torch.tensor(arow)[lay.tok_row], lay.flat] = posids
    return qpos.view(na, lay.q), kpos


def kept_logits(lens: list[int], dls: list[int]) -> torch.Tensor:
    """The packed indices of each row's last len(draft) + 1 tokens (rows in order): the logits a
    packed forward keeps."""
    need, t = [], 0
    for n, d in zip(lens, dls):
        need += range(t + n - d - 1, t + n)
        t += n
    return longs(need)


def kept_starts(dls: list[int]) -> list[int]:
    """Where each row's kept logits begin, rows in order, each row keeping len(draft) + 1."""
    out, o = [], 0
    for d in dls:
        out.append(o)
        o += d + 1
    return out
