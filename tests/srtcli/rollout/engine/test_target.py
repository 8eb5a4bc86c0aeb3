"""The target distributions verification reads (`Target`): the same shaped p as plain sampling's
`shape_probs` in every mode, read only where asked."""

from __future__ import annotations

import pytest
import torch

from srtcli.rollout.engine.sampling import SamplingParams, shape_probs
from srtcli.rollout.engine.target import Target

MODES = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.6), SamplingParams(1.0, top_k=7),
         SamplingParams(0.8, top_p=0.9), SamplingParams(1.2, top_k=20, top_p=0.7)]


@pytest.mark.parametrize("params", MODES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_target_reads_the_shaped_distribution(params):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 300, generator=gen) * 4
    want = shape_probs(logits, params)
    target = Target(logits, [0, 5, 6], params)
    idx = torch.tensor([0, 3, 5, 11])
    toks = torch.tensor([want[i].argmax() for i in idx.tolist()])  # likely tokens, and unlikely ones
    torch.testing.assert_close(target.probs_of(idx, toks), want[idx, toks], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(target.probs_of(idx, toks + 1), want[idx, toks + 1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(target.dists(idx), want[idx], atol=1e-6, rtol=1e-5)


def test_at_and_dense_follow_the_rows_kept_positions():
    # rows keep 5, 1 and 6 positions (drafts of 4, 0 and 5 tokens)
    logits = torch.randn(12, 30)
    target = Target(logits, [0, 5, 6], SamplingParams(1.0))
    assert [target.at(0, 4), target.at(1, 0), target.at(2, 3)] == [4, 5, 9]
    dense = target.dense(keep=6)
    want = shape_probs(logits, SamplingParams(1.0))
    torch.testing.assert_close(dense[0, :5], want[:5])
    torch.testing.assert_close(dense[0, 5], want[4])  # past a row's draft: its last p again
    torch.testing.assert_close(dense[1], want[5].expand(6, -1))
    torch.testing.assert_close(dense[2], want[6:12])
