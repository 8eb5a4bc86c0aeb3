"""The engine's attention is installed by the engine, not by importing it, and its per-forward
index maps live only for the forward that set them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from srtcli.rollout.engine.kv_cache import Packed, Windows, packed_attention, slot_attention

ROOT = Path(__file__).resolve().parents[4]

REGISTRATION = """
from transformers import AttentionInterface
import srtcli.rollout.engine.engine
from srtcli.rollout.drafters.base import Drafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.tiny_model import tiny_model

print("after import:", "srt_slots" in AttentionInterface())
Engine(tiny_model("llama", 64, 0), SamplingParams(temperature=0), Drafter(), slots=2, max_len=16)
print("after engine:", "srt_slots" in AttentionInterface())
"""


def test_importing_the_engine_registers_no_attention_and_an_engine_does():
    out = subprocess.run([sys.executable, "-c", REGISTRATION], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["after import: False", "after engine: True"]


def test_the_index_maps_live_only_inside_their_forward():
    q = torch.randn(1, 2, 3, 4)  # [1, heads, T, dim]: three packed tokens
    k = v = torch.randn(2, 2, 5, 4)  # two attention rows of five cache columns
    mask = torch.zeros(2, 1, 2, 5)
    pk = Packed(gather=torch.tensor([0, 1, 0, 2]), scatter=torch.tensor([0, 1, 3]), b=2, q=2)
    with packed_attention(pk, Windows(lambda: (torch.zeros(2, 2), torch.zeros(2, 5)))):
        inside = slot_attention(None, q, k, v, mask)[0]
    assert inside.shape == (1, 3, 2, 4)  # back in packed order
    padded = torch.randn(2, 2, 2, 4)  # after the forward, a padded call: no gathering
    assert slot_attention(None, padded, k, v, mask)[0].shape == (2, 2, 2, 4)


def ragged_forward(split: bool, monkeypatch) -> torch.Tensor:
    """One packed attention over four rows of 1, 3, 1 and 2 queries (a plain decode row beside
    drafting rows), split into every row's last query plus the others, or not."""
    import srtcli.rollout.engine.kv_cache as kv

    monkeypatch.setattr(kv, "split_pays", lambda rows, multi, q: split and q > 1 and multi > 0)
    torch.manual_seed(0)
    lens, starts = [1, 3, 1, 2], [4, 2, 6, 3]
    lay = kv.layout(lens, starts, list(range(4)), 4)
    assert (lay.multi is not None) == split
    q = torch.randn(1, 4, sum(lens), 8)  # [1, heads, T, dim]
    k, v = torch.randn(4, 2, lay.lcur, 8), torch.randn(4, 2, lay.lcur, 8)  # grouped KV heads
    vis = torch.arange(lay.lcur)[None, None, :] <= lay.pos[:, :, None]
    mask = torch.zeros(4, 1, lay.q, lay.lcur).masked_fill_(~vis[:, None], torch.finfo(torch.float32).min)
    with packed_attention(lay.packed()):
        return slot_attention(None, q, k, v, mask)[0]


def test_split_attention_gives_every_query_what_the_unsplit_layout_gives(monkeypatch):
    """Splitting off the rows with several queries changes only which SDPA call computes a
    query, never what it attends to."""
    split, whole = ragged_forward(True, monkeypatch), ragged_forward(False, monkeypatch)
    assert split.shape == whole.shape == (1, 7, 4, 8)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)


def test_split_pays_where_rows_without_drafts_would_be_padded():
    from srtcli.rollout.engine.kv_cache import split_pays

    assert split_pays(32, 1, 2) and split_pays(32, 8, 5)  # a few drafting rows among many
    assert not split_pays(32, 32, 2)  # every row drafts: nothing is padded, a split only gathers
    assert not split_pays(32, 0, 1)  # plain decode
