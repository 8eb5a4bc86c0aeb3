"""The `ngram` drafter: prompt lookup (as vLLM's ngram and transformers' prompt lookup).

Find the most recent earlier occurrence of the sequence's last n tokens (n from `max_n` down to
`min_n`) in the prompt plus the output so far, and propose the tokens that followed it.
Deterministic, so drafts are verified as point masses.
"""

from __future__ import annotations

from typing import Any

from srtcli.rollout.drafters.base import Drafter, Proposal


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 3):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq: Any, budget: int) -> Proposal:
        """One backward scan in plain Python (cheaper than numpy windows on sequences of a few
        hundred tokens, and called for every row at every step): for each earlier end position
        i, the length of the match of toks[..i] with the sequence's tail; the answer is the
        latest i among the longest matches (at least min_n, at most max_n)."""
        toks = seq.tokens
        n_all = len(toks)
        n_max = min(self.max_n, n_all - 1)
        if n_max < self.min_n:
            return Proposal([])
        last = toks[-1]
        best_n, best_i = 0, -1
        for i in range(n_all - 2, -1, -1):
            if toks[i] != last:
                continue
            m = 1
            while m < n_max and m <= i and toks[i - m] == toks[n_all - 1 - m]:
                m += 1
            if m > best_n:
                best_n, best_i = m, i
                if m == n_max:
                    break
        if best_n < self.min_n:
            return Proposal([])
        return Proposal(toks[best_i + 1: best_i + 1 + budget])
