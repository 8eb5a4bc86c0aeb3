"""The `ngram` drafter: prompt lookup (as vLLM's ngram and transformers' prompt lookup).

Find the most recent earlier occurrence of the sequence's last n tokens (n from `max_n` down to
`min_n`) in the prompt plus the output so far, and propose the tokens that followed it.
Deterministic, so drafts are verified as point masses.

Two ways to the same proposal: a plain Python backward scan for short contexts (a few us at
a few hundred tokens), and for longer ones a few vectorised passes over the sequence's tokens,
kept in a numpy array made when the context passes SCAN_MAX tokens and appended to as the
engine extends it. Like vLLM's proposer it still reads the whole context: ~20 us at 16,000
tokens, against ~0.5 ms for the scan (bench/drafter_cost_bench.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from srtcli.rollout.drafters.base import Drafter, Proposal


class TokenArray:
    """A sequence's tokens as a growing int64 array (amortised O(1) appends)."""

    def __init__(self, tokens: list[int]):
        self.buf = np.zeros(max(64, 2 * len(tokens)), dtype=np.int64)
        self.n = 0
        self.add(tokens)

    def add(self, tokens: list[int]) -> None:
        k = len(tokens)
        if self.n + k > len(self.buf):
            self.buf = np.concatenate([self.buf[: self.n], np.zeros(max(self.n, k), dtype=np.int64)])
        self.buf[self.n: self.n + k] = tokens
        self.n += k

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


SCAN_MAX = 256  # contexts up to this many tokens take the Python scan (numpy's call overhead)


def scan_match(toks: list[int], n_max: int) -> tuple[int, int]:
    """`latest_longest_match` as one backward scan in plain Python."""
    end, best_n, best_i = len(toks) - 1, 0, -1
    for i in range(end - 1, -1, -1):
        if toks[i] != toks[end]:
            continue
        m = 1
        while m < n_max and m <= i and toks[i - m] == toks[end - m]:
            m += 1
        if m > best_n:
            best_n, best_i = m, i
            if m == n_max:
                break
    return best_n, best_i


def latest_longest_match(toks: np.ndarray, n_max: int) -> tuple[int, int]:
    """(n, i): the longest n <= n_max such that the n tokens ending at an earlier position i equal
    the last n tokens, and the latest such i; (0, -1) if the last token never occurred before."""
    end = len(toks) - 1
    cand = np.flatnonzero(toks[:end] == toks[end])  # earlier positions holding the last token
    if not len(cand):
        return 0, -1
    match = np.ones(len(cand), dtype=np.int64)
    alive = np.ones(len(cand), dtype=bool)
    for j in range(1, n_max):  # extend every match still whole by one token further back
        alive &= cand >= j
        alive[alive] = toks[cand[alive] - j] == toks[end - j]
        match += alive
    n = int(match.max())
    return n, int(cand[np.flatnonzero(match == n)[-1]])


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 3):
        self.min_n, self.max_n = min_n, max_n

    def begin(self, seq: Any) -> None:
        seq.drafter_state = None  # the array is made once the context outgrows the scan

    def extend(self, seq: Any, tokens: list[int]) -> None:
        if seq.drafter_state is not None:
            seq.drafter_state.add(tokens)

    def end(self, seq: Any) -> None:
        seq.drafter_state = None

    def propose(self, seq: Any, budget: int) -> Proposal:
        n_max = min(self.max_n, len(seq.tokens) - 1)
        if n_max < self.min_n:
            return Proposal([])
        if len(seq.tokens) <= SCAN_MAX:
            n, i = scan_match(seq.tokens, n_max)
        else:
            state = seq.drafter_state
            if state is None or state.n != len(seq.tokens):  # first past SCAN_MAX, or not extended by an engine
                state = seq.drafter_state = TokenArray(seq.tokens)
            n, i = latest_longest_match(state.view(), n_max)
        if n < self.min_n:
            return Proposal([])
        return Proposal(seq.tokens[i + 1: i + 1 + budget])
