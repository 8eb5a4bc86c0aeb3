"""The calibration bench's uniformity check: uniform p-values pass, p-values piled near 0 do not."""

import random

from bench.sampling_calibration import ks_uniform


def test_uniform_p_values_are_not_flagged():
    rng = random.Random(0)
    d, p = ks_uniform([rng.random() for _ in range(300)])
    assert d < 0.1 and p > 0.05


def test_p_values_piled_near_zero_are_flagged():
    rng = random.Random(0)
    d, p = ks_uniform([rng.random() ** 2 for _ in range(300)])  # what a small bias does to many runs
    assert d > 0.15 and p < 1e-4
