"""`cache_bench.py --scale` on a tiny workload: every installed kind measures every figure, and
p-hat changes what the store holds, not what is drafted."""

import numpy as np
import pytest

from bench.cache_bench import KINDS, TARGETS, child, installed
from bench.workloads import make_prompt, noisy_copy, zipf_tokens

TINY = dict(responses=2, length=128, paths=2, big=4, steps=2, prompts=2, k=2, epoch=2)


def test_a_response_is_a_noisy_copy_of_its_paths():
    rng = np.random.default_rng(0)
    paths = [zipf_tokens(rng, int(300 * 1.6) + 64) for _ in range(2)]
    r = noisy_copy(rng, paths, 300)
    assert r.dtype == np.int32 and r.size == 300
    grams = {tuple(p[i:i + 3]) for p in paths for i in range(p.size - 2)}
    copied = np.mean([tuple(r[i:i + 3]) in grams for i in range(r.size - 2)])
    assert 0.5 < copied < 1.0  # mostly copied runs, broken by insertions, substitutions and skips
    assert [a.tolist() for a in make_prompt(1, 2, 64, 2)] == [a.tolist() for a in make_prompt(1, 2, 64, 2)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_measures_every_figure(kind: str):
    if not installed(kind):
        pytest.skip(f"{kind} is not installed")
    res = child(kind, TINY)
    assert set(TARGETS) <= set(res)
    assert res["tokens"] == 2 * 128 and res["replay_tokens_per_forward"] >= 1.0


def test_p_hat_costs_disk_bytes_not_drafts():
    new, new_p = child("new", TINY), child("new-p", TINY)
    assert new_p["replay_tokens_per_forward"] == new["replay_tokens_per_forward"]
    assert new_p["disk_bytes_per_token"] > new["disk_bytes_per_token"]
