"""The adaptive draft length: two tokens longer after a fully accepted draft (up to the budget),
else what was accepted plus one; the array form used by the vLLM proposer is the same rule; in
the long tail (at most a quarter of the slots running) no adaptive length applies."""

from __future__ import annotations

import itertools

import numpy as np

from srtcli.rollout.drafters.draft_length import in_the_tail, next_draft_length, next_draft_lengths


def test_the_rule():
    assert next_draft_length(4, 8, 4, 4) == 6  # all accepted: longer
    assert next_draft_length(7, 8, 7, 7) == 8  # never past the budget
    assert next_draft_length(6, 8, 6, 2) == 3  # what was accepted, plus one
    assert next_draft_length(6, 8, 6, 0) == 1  # never below one


def test_the_array_form_is_the_same_rule():
    cases = [(c, d, a) for c, d in itertools.product(range(1, 10), range(1, 10)) for a in range(d + 1)]
    cur, drafted, acc = (np.array(x, dtype=np.int64) for x in zip(*cases))
    for budget in (1, 4, 8):
        want = [next_draft_length(c, budget, d, a) for c, d, a in cases]
        assert next_draft_lengths(cur, budget, drafted, acc).tolist() == want


def test_the_long_tail_is_at_most_a_quarter_of_the_slots():
    assert [in_the_tail(r, 32) for r in (1, 8, 9, 32)] == [True, True, False, False]
    assert [in_the_tail(r, 3) for r in (0, 1)] == [True, False]  # a small batch: only when none run
