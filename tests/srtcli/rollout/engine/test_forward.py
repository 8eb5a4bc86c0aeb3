"""The packed forward's kept logits: each row's last len(draft) + 1 tokens, laid out per row."""

from __future__ import annotations

from srtcli.rollout.engine.forward import kept_logits, kept_starts


def test_kept_logits_are_each_rows_last_draft_plus_one_tokens():
    # three rows of 3, 1 and 5 packed tokens (0-2, 3, 4-8) with drafts of 2, 0 and 3 tokens
    assert kept_logits([3, 1, 5], [2, 0, 3]).tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    # row r's p_0 is kept logit kept_starts[r], its p_k the k-th after it
    assert kept_starts([2, 0, 3]) == [0, 3, 4]
