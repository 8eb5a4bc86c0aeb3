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
