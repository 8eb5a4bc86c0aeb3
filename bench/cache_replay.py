"""A replay of an RL run's cache traffic for `bench/cache_bench.py --scale`.

Each step serves `prompts` prompts; a prompt comes back every `epoch` steps with K new
responses (noisy copies of its reasoning paths, generated before timing). Per prompt, as the
srt drafter does: load its tree at group start, open K samples, and until each sample has all
its tokens, interleaved: draft 16 tokens from the last 64 of its context, accept the prefix
that agrees with the real response plus one token (the target model's own), stream those in;
commit at group end. Only the tree and store calls are timed ("host seconds of tree work").
"""

from __future__ import annotations

import resource
import tempfile
import time

import numpy as np

from bench.cache_kinds import make_kind


def _accepted(draft: list[int], truth: list[int], pos: int) -> int:
    n = 0
    while n < len(draft) and pos + n < len(truth) and draft[n] == truth[pos + n]:
        n += 1
    return n


def _group(k, store, uid: str, responses: list[list[int]]) -> tuple[float, int, int]:  # noqa: ANN001
    """Serve one group; (tree seconds, forwards, tokens)."""
    t = 0.0
    t0 = time.perf_counter()
    group = k.begin_group(store, uid)
    samples = [k.open_sample(group) for _ in responses]
    t += time.perf_counter() - t0
    pos = [0] * len(responses)
    forwards = 0
    while True:
        live = [i for i, r in enumerate(responses) if pos[i] < len(r)]
        if not live:
            break
        for i in live:
            r, p = responses[i], pos[i]
            ctx = r[max(0, p - 64):p]
            t0 = time.perf_counter()
            draft = k.draft_in(group, samples[i], ctx) if ctx else []
            t += time.perf_counter() - t0
            chunk = r[p:p + _accepted(draft, r, p) + 1]
            t0 = time.perf_counter()
            k.extend_sample(samples[i], chunk)
            t += time.perf_counter() - t0
            pos[i] += len(chunk)
            forwards += 1
    t0 = time.perf_counter()
    k.end_group(store, uid, group, samples, responses)
    t += time.perf_counter() - t0
    return t, forwards, sum(map(len, responses))


def replay(kind: str, cfg: dict) -> dict:
    k = make_kind(kind)
    per_step, forwards, tokens = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        store = k.open_store(f"{tmp}/replay")
        for step in range(cfg["steps"]):
            visit, first = divmod(step, cfg["epoch"])
            seconds = 0.0
            for j in range(cfg["prompts"]):
                p = first * cfg["prompts"] + j
                rng_seed = 1000 * p + visit  # new samples on each visit, same reasoning paths
                resp = [a.tolist() for a in _responses(p, rng_seed, cfg)]
                s, f, n = _group(k, store, f"prompt{p}", resp)
                seconds, forwards, tokens = seconds + s, forwards + f, tokens + n
            per_step.append(seconds)
        k.close_store(store)
    return {"replay_s_per_step": float(np.mean(per_step)), "replay_last_step_s": per_step[-1],
            "replay_tokens_per_forward": tokens / max(1, forwards),
            "replay_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30}


def _responses(prompt: int, seed: int, cfg: dict) -> list[np.ndarray]:
    """K responses of `prompt` on one visit: the prompt's paths, fresh noise."""
    from bench.cache_scale import noisy_copy, zipf_tokens

    base_rng = np.random.default_rng(prompt)
    paths = [zipf_tokens(base_rng, int(cfg["length"] * 1.6) + 64) for _ in range(cfg["paths"])]
    rng = np.random.default_rng(seed + 7)
    return [noisy_copy(rng, paths, cfg["length"]) for _ in range(cfg["k"])]
