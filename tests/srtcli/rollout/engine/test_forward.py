"""The packed forward's kept logits: each row's last len(draft) + 1 tokens, laid out per row."""

from __future__ import annotations

from srtcli.rollout.engine.forward import kept_logits


def test_kept_logits_are_each_rows_last_draft_plus_one_tokens():
    # three rows of 3, 1 and 5 packed tokens (0-2, 3, 4-8) with drafts of 2, 0 and 3 tokens
    need, pick = kept_logits([3, 1, 5], [2, 0, 3], keep=4)
    assert need.tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    # row r's p_k is kept logit pick[r * keep + k]; past a row's draft it repeats its last
    assert pick.view(3, 4).tolist() == [[0, 1, 2, 2], [3, 3, 3, 3], [4, 5, 6, 7]]
