"""The `ngram` drafter: prompt lookup (as vLLM's ngram and transformers' prompt lookup).

Find the most recent earlier occurrence of the sequence's last n tokens (n from `max_n` down to
`min_n`) in the prompt plus the output so far, and propose the tokens that followed it.
Deterministic, so drafts are verified as point masses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from srtcli.drafters import Drafter, Proposal


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 3):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq: Any, budget: int) -> Proposal:
        toks = np.asarray(seq.tokens, dtype=np.int64)
        n_all = len(toks)
        for n in range(min(self.max_n, n_all - 1), self.min_n - 1, -1):
            tail = toks[n_all - n:]
            windows = np.lib.stride_tricks.sliding_window_view(toks[: n_all - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return Proposal(toks[start: start + budget].tolist())
        return Proposal([])
