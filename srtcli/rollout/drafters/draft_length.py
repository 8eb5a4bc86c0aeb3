"""The adaptive draft length, one rule for the embedded engine and the vLLM proposer.

After a draft is verified, the next one may be 2 tokens longer (up to the budget) if every
drafted token was accepted, else as long as what was accepted plus one. It depends only on
past outcomes, so verification stays exact; on a compute-bound device it stops paying for
tokens that keep being rejected. That saving is real only while the batch is full: in the long
tail (at most FULL_DRAFT_SHARE of the slots running) a forward costs about its fixed overhead
whatever its rows draft, so there every row drafts the whole budget (`in_the_tail`).
"""

from __future__ import annotations

import numpy as np

# how the embedded engine chooses a row's draft length: `cost` verifies what is expected to
# save time (srtcli.rollout.engine.draft_cost), `adaptive` follows the rule below, `fixed`
# drafts the whole budget
DRAFT_LENGTHS = ("cost", "adaptive", "fixed")

# measured on the bundled workload (docs/benchmarks.md, "What each of srt's parts is worth"):
# 1/8 to 1/2 of the slots all take fewer forwards than no tail rule, a quarter about the fewest,
# at no cost in CPU wall time
FULL_DRAFT_SHARE = 1 / 4


def in_the_tail(rows: int, slots: int) -> bool:
    """Whether a step running `rows` of `slots` rows is in the long tail, where every row drafts
    the whole budget whatever its adaptive length."""
    return rows <= slots * FULL_DRAFT_SHARE


def next_draft_length(current: int, budget: int, drafted: int, accepted: int) -> int:
    """The next draft length after `accepted` of `drafted` tokens were accepted (drafted > 0)."""
    return min(budget, current + 2) if accepted == drafted else max(1, accepted + 1)


def next_draft_lengths(current: np.ndarray, budget: int, drafted: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """`next_draft_length` for many rows at once (arrays of one step's outcomes)."""
    return np.where(accepted == drafted, np.minimum(budget, current + 2), np.maximum(1, accepted + 1))
