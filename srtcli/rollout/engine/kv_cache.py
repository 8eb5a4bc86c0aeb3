"""The engine's KV cache and attention: per-slot buffers with independent lengths, and the
two forward layouts (packed and padded) that read and write them.

How the pieces fit (the engine, `srtcli.rollout.engine.engine.Engine`, drives them):

- `SlotKVCache` is a transformers `Cache` whose per-layer buffers are [slots, kv_heads, L+1, D].
  Each slot (one sequence) has its own valid length; before a forward the engine says (via
  `prepare`) at which (slot, column) each query's new keys/values go, and `update` writes them
  there with a scatter. Rolling back rejected draft positions is just not counting them: they
  lie past the slot's valid length, the engine's mask hides them, and later tokens overwrite
  them. transformers' DynamicCache cannot do this (it crops the whole batch at once). Column L
  is a trash column where the padding queries of a padded forward write.
- Reads: attention row r reads slot `rows[r]`'s first `lcur` columns. When the attention rows
  are exactly all slots in order, the read is a view of the buffer instead of a gather.
- Padded forwards: rows left-padded to one length ([b, q] input). Simple and cheap when rows
  have (nearly) the same length, e.g. plain decode where every row carries one token; also the
  only path for attention implementations we do not replace (e.g. flash).
- Packed forwards: the model runs on the real tokens of all rows concatenated ([1, T] input,
  per-token `position_ids`), so its linear layers and LM head spend nothing on padding. Only
  attention needs the per-row [b, heads, q, dim] layout: `slot_attention` (the `srt_slots`
  attention implementation, registered by `register_slot_attention`, which the engine calls)
  gathers the queries into it with the `Packed` index maps (built by `layout`), runs SDPA with
  the engine's explicit additive 4-D mask, and gathers the outputs back to packed order. The
  engine sets the maps only for the duration of its own forward (`packed_attention`). When
  a few rows carry drafts among many that carry one token, attention is split
  (`split_pays`): every row's last query in one call over the cache as it is, then only the
  drafting rows' other queries over their gathered keys and values, so attention costs the
  queries there are rather than every row padded to the longest draft (on SmolLM2 with 32
  rows, one row's one-token draft added 25% to a forward unsplit, 10% split). On the CPU
  only, where it was measured: where attention is bound by reading the keys and values (a
  GPU, long contexts) padded queries cost little and the split's gather would cost more. Why
  both: packing saves the padding's FLOPs on ragged batches (a prompt next to decode rows,
  uneven drafts) but its bookkeeping costs more than it saves when there is little padding.
  Both give bit-identical outputs.
- Per layer, as transformers defines it: a layer's `sliding_window` narrows the mask to keys
  fewer than `window` positions behind the query (`Windows`, from the positions of the
  forward's queries and keys: a tree node's is its depth), and a layer's `softcap` (attention
  logit softcapping, which SDPA cannot do) runs the explicit eager computation instead of SDPA.
  Models whose attention carries anything else are refused when they load
  (`srtcli.attention_support`).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache

from attention.hf import explicit_attention
from srtcli.rollout.engine.host_tensors import longs


@dataclass
class Packed:
    """How the packed tokens of one forward map to the padded [b, q] layout attention uses:
    `gather[r, c]` is the packed index of row r's query c (0 for left padding). Unsplit
    (`multi` None), `scatter[t]` is packed token t's flat index r * q + c in the attention's
    output. Split, `multi` lists the rows with more than one query and the output is every
    row's last query ([b] entries) followed by those rows' other queries ([len(multi), q - 1]),
    which `scatter` indexes."""

    gather: torch.Tensor  # [b * q] long
    scatter: torch.Tensor  # [T] long
    b: int
    q: int
    multi: torch.Tensor | None = None  # [m] long

    def to(self, device: torch.device) -> "Packed":
        multi = None if self.multi is None else self.multi.to(device)
        return Packed(self.gather.to(device), self.scatter.to(device), self.b, self.q, multi)


class Windows:
    """The positions of one forward's queries and keys, from which `slot_attention` derives a
    sliding-window layer's mask: key k stays visible to query q iff pos_q - pos_k < window (as
    transformers' sliding-window masks). `positions` gives ([b, q] query positions, [b, lcur] key
    positions); it runs only if some layer has a window, once per forward."""

    def __init__(self, positions: Callable[[], tuple[torch.Tensor, torch.Tensor]]):
        self._positions = positions
        self._masks: dict[int, torch.Tensor] = {}
        self._pos: tuple[torch.Tensor, torch.Tensor] | None = None

    def mask(self, full: torch.Tensor, window: int) -> torch.Tensor:
        """`full` (the forward's additive [b, 1, q, lcur] mask) with keys outside `window` hidden."""
        if window not in self._masks:
            if self._pos is None:
                self._pos = tuple(x.to(full.device) for x in self._positions())
            qpos, kpos = self._pos
            far = (qpos[:, None, :, None] - kpos[:, None, None, : full.shape[-1]]) >= window
            self._masks[window] = full.masked_fill(far, torch.finfo(full.dtype).min)
        return self._masks[window]


# Set by the engine only for the duration of its own forward (see `packed_attention`).
_PACKED: ContextVar[Packed | None] = ContextVar("srt_slots_packed", default=None)
_WINDOWS: ContextVar[Windows | None] = ContextVar("srt_slots_windows", default=None)


@contextmanager
def packed_attention(packed: Packed | None, windows: Windows | None = None) -> Iterator[None]:
    """Make `slot_attention` use `packed`'s index maps (None: a padded forward) and `windows`'
    positions for sliding-window layers until exit."""
    tokens = _PACKED.set(packed), _WINDOWS.set(windows)
    try:
        yield
    finally:
        _PACKED.reset(tokens[0])
        _WINDOWS.reset(tokens[1])


def slot_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                   sliding_window=None, softcap=None, **kwargs):
    """SDPA with our explicit additive mask, letting SDPA handle grouped KV heads itself
    (transformers' sdpa path copies K/V per group whenever a mask is given). In a packed
    forward the model's linear layers ran on the T real tokens only ([1, T] input, no padding
    FLOPs); here the queries are laid out as [b, heads, q, dim] for the per-row attention and
    the outputs are gathered back to the packed order. A layer's `sliding_window` narrows the
    mask (`Windows`); a layer's `softcap` (logit softcapping, which SDPA cannot apply) takes
    the explicit path of transformers' eager attention. What else a layer may pass is refused
    when the model is loaded (`srtcli.attention_support`), never silently dropped here."""
    pk, windows = _PACKED.get(), _WINDOWS.get()
    if pk is not None:
        heads, dim = query.shape[1], query.shape[3]
        # [T, heads, dim] is the projections' memory order: gathering along dim 0 is a row copy
        query = query[0].transpose(0, 1).index_select(0, pk.gather).view(pk.b, pk.q, heads, dim).transpose(1, 2)
    if sliding_window is not None:
        if windows is None:
            raise RuntimeError("srt_slots: a sliding-window layer outside an engine forward")
        attention_mask = windows.mask(attention_mask, sliding_window)
    if pk is None:
        return _attend(query, key, value, attention_mask, scaling, softcap).transpose(1, 2).contiguous(), None
    if pk.multi is None:
        out = _attend(query, key, value, attention_mask, scaling, softcap).transpose(1, 2)
        return out.reshape(pk.b * pk.q, heads, dim).index_select(0, pk.scatter)[None], None
    # Split: every row's last query against the cache as it is (a view when the rows are all
    # slots), then only the rows with more: attention's cost follows the queries there are,
    # not rows x the longest row's queries.
    m = pk.multi
    last = _attend(query[:, :, -1:], key, value, attention_mask[:, :, -1:], scaling, softcap)
    rest = _attend(query.index_select(0, m)[:, :, :-1], key.index_select(0, m), value.index_select(0, m),
                   attention_mask.index_select(0, m)[:, :, :-1], scaling, softcap)
    out = torch.cat([last.transpose(1, 2).reshape(pk.b, heads, dim),
                     rest.transpose(1, 2).reshape(len(m) * (pk.q - 1), heads, dim)])
    return out.index_select(0, pk.scatter)[None], None


def _attend(query, key, value, mask, scaling, softcap):
    """[b, heads, q, dim] attention of `query` over `key`/`value` under the additive `mask`."""
    if softcap is not None:
        return explicit_attention(query, key, value, mask, scaling, softcap)[0]
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])


def register_slot_attention() -> None:
    """Make `srt_slots` a transformers attention implementation (`slot_attention`), once: a
    later call keeps whatever is registered under the name."""
    if "srt_slots" not in AttentionInterface():
        AttentionInterface.register("srt_slots", slot_attention)


class SlotKVCache(Cache):
    """Per-slot keys/values with independent lengths; see the module docstring."""

    def __init__(self, slots: int, max_len: int):
        super().__init__(layers=[])
        self.slots, self.max_len = slots, max_len
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self._rows = self._wslot = self._widx = None
        self._all = False
        self._lcur = 0

    def prepare(self, rows: torch.Tensor, wslot: torch.Tensor, widx: torch.Tensor, lcur: int,
                all_slots: bool = False) -> None:
        """Set where the next forward writes and reads: the model's query (i, c) (batch row i,
        position c of its input) goes to slot wslot[i, c], column widx[i, c]; attention batch
        row r reads slot rows[r], columns [0, lcur). `all_slots`: rows is exactly
        0..slots-1, so reads are views instead of gathers."""
        self._rows, self._wslot, self._widx, self._lcur, self._all = rows, wslot, widx, lcur, all_slots

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx not in self.k:
            _, heads, _, dim = key_states.shape
            shape = (self.slots, heads, self.max_len + 1, dim)
            self.k[layer_idx] = key_states.new_zeros(shape)
            self.v[layer_idx] = value_states.new_zeros(shape)
        kb, vb = self.k[layer_idx], self.v[layer_idx]
        idx = (self._wslot, slice(None), self._widx)
        kb[idx] = key_states.transpose(1, 2).to(kb.dtype)
        vb[idx] = value_states.transpose(1, 2).to(vb.dtype)
        if self._all:
            return kb[:, :, : self._lcur], vb[:, :, : self._lcur]
        # slice before gathering: copies only the lcur columns attention reads
        return kb[:, :, : self._lcur].index_select(0, self._rows), vb[:, :, : self._lcur].index_select(0, self._rows)

    @torch.inference_mode()
    def copy_prefix(self, src: int, dst: list[int], n: int) -> None:
        """Give the slots `dst` the keys/values of slot `src`'s first n positions (a shared
        prompt): one copy per buffer, whatever the number of slots."""
        if not self.k:
            return
        rows = longs(dst).to(next(iter(self.k.values())).device)
        for layer in self.k:
            self.k[layer][rows, :, :n] = self.k[layer][src, :, :n]
            self.v[layer][rows, :, :n] = self.v[layer][src, :, :n]

    @torch.inference_mode()
    def move(self, slots: list[int], src: list[int], dst: list[int]) -> None:
        """Copy the keys/values at (slots[i], src[i]) to (slots[i], dst[i]) in every layer
        (accepted tree nodes to the columns a chain of them would have)."""
        dev = next(iter(self.k.values())).device
        sl, s, d = (longs(x).to(dev) for x in (slots, src, dst))
        for layer in self.k:
            for buf in (self.k[layer], self.v[layer]):
                buf[sl, :, d] = buf[sl, :, s]  # the gather copies before the write

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly


@dataclass
class Layout:
    """A packed forward's index maps (built by `layout`): packed token t belongs to input row
    tok_row[t] and sits at cache column flat[t]; attention row a is left-padded by pad[a]."""

    tok_row: torch.Tensor
    flat: torch.Tensor
    first: torch.Tensor  # packed index of each input row's first token
    pos: torch.Tensor  # [na, q] positions (0 on padding)
    pad: torch.Tensor  # [na]
    gather: torch.Tensor
    scatter: torch.Tensor  # packed token t's flat index a * q + c in the [na, q] layout
    q: int
    lcur: int
    multi: torch.Tensor | None = None  # attention rows with more than one query, when split

    def packed(self) -> Packed:
        """The maps `slot_attention` reads: split into every row's last query and the rest of
        the rows with more (`multi`), or not."""
        na = self.pos.shape[0]
        if self.multi is None:
            return Packed(self.gather, self.scatter, na, self.q)
        row, col = self.scatter // self.q, self.scatter % self.q
        rank = torch.zeros(na, dtype=torch.long)
        rank[self.multi] = torch.arange(len(self.multi))
        out = torch.where(col == self.q - 1, row, na + rank[row] * (self.q - 1) + col)
        return Packed(self.gather, out, na, self.q, self.multi)


def split_pays(rows: int, multi: int, q: int) -> bool:
    """Whether attention split into every row's last query plus the `multi` rows' others costs
    less than all `rows` padded to `q` queries: per layer the split reads those rows' keys and
    values twice (a gather, then attention) and pays for q - 1 queries on each of them."""
    return q > 1 and rows + multi * (q + 1) < rows * q


def layout(lens: list[int], starts: list[int], arow: list[int], na: int, split: bool = True) -> Layout:
    """Index maps for input rows of `lens` tokens starting at cache columns `starts`, input row r
    being attention row arow[r] of na (the others are all padding); attention split where
    `split` allows and `split_pays`. Built in plain Python: a few hundred entries, cheaper than
    a chain of small tensor ops."""
    q = max(lens)
    tok_row, flat, scatter, first = [], [], [], []
    pos, pad, gather = [0] * (na * q), [q] * na, [0] * (na * q)
    t = 0
    for r, (n, c, a) in enumerate(zip(lens, starts, arow)):
        base = a * q + q - n
        pad[a] = q - n
        first.append(t)
        tok_row += [r] * n
        flat += range(c, c + n)
        scatter += range(base, base + n)
        gather[base: base + n] = range(t, t + n)
        pos[base: base + n] = range(c, c + n)
        t += n
    lcur = max(c + n for c, n in zip(starts, lens))
    multi = [a for n, a in zip(lens, arow) if n > 1]
    return Layout(longs(tok_row), longs(flat), longs(first), longs(pos).view(na, q), longs(pad),
                  longs(gather), longs(scatter), q, lcur,
                  longs(multi) if split and split_pays(na, len(multi), q) else None)
