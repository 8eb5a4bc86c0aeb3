"""Synthetic long-CoT token workloads shared by the benchmarks (cache_bench.py, proposer_bench.py,
drafter_cost_bench.py); not a script.

A prompt's responses are noisy copies (substitutions, insertions, skips) of a few reasoning
paths of Zipf-distributed tokens, the way K samples of one prompt resemble each other; a response
follows one path and may switch to another part-way. `token_probs` gives such a rollout's
tokens a synthetic policy probability (p-hat).
"""

from __future__ import annotations

import numpy as np


def zipf_tokens(rng: np.random.Generator, n: int, vocab: int = 32_000) -> np.ndarray:
    """n tokens drawn with probability proportional to 1 / rank."""
    p = 1.0 / np.arange(1, vocab + 1)
    return rng.choice(vocab, size=n, p=p / p.sum()).astype(np.int32)


def noisy_copy(rng: np.random.Generator, paths: list[np.ndarray], length: int) -> np.ndarray:
    """One response: a copy of a path with 4% insertions, 4% substitutions, 2% skips of 1-4
    tokens, switching to another path (same position) with probability 0.3 once. Paths must be
    at least 1.6 x `length` + 64 tokens long."""
    weights = np.array([0.6, 0.3, 0.1][: len(paths)])
    first = int(rng.choice(len(paths), p=weights / weights.sum()))
    switch_at = int(rng.integers(0, length)) if rng.random() < 0.3 else length
    second = int(rng.integers(0, len(paths)))
    n = int(length * 1.25) + 64
    r = rng.random(n)
    advance = np.where(r < 0.04, 0, np.where((r >= 0.08) & (r < 0.10), rng.integers(2, 6, n), 1))
    src = np.cumsum(advance) - advance
    keep = ~((r >= 0.08) & (r < 0.10))
    src, r = src[keep][:length], r[keep][:length]
    out = np.where(np.arange(src.size) < switch_at, paths[first][src], paths[second][src])
    noise = zipf_tokens(rng, src.size)
    return np.where(r < 0.08, noise, out).astype(np.int32)


def make_prompt(seed: int, responses: int, length: int, paths: int) -> list[np.ndarray]:
    """`responses` noisy copies, `length` tokens each, of `paths` reasoning paths of one prompt."""
    rng = np.random.default_rng(seed)
    base = [zipf_tokens(rng, int(length * 1.6) + 64) for _ in range(paths)]
    return [noisy_copy(rng, base, length) for _ in range(responses)]


def token_probs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Synthetic p-hat for n sampled tokens of a long reasoning rollout: most tokens are all but
    determined (80%: Beta(30, 1), mean 0.97), a minority are forks where the policy spreads its
    mass (20%: uniform on (0, 1)). An assumption, not a measurement: p-hat is one byte per token
    in a record whatever its value, and only how well those bytes compress depends on it."""
    fork = rng.random(n) < 0.2
    return np.where(fork, rng.random(n), rng.beta(30.0, 1.0, n)).astype(np.float32)
