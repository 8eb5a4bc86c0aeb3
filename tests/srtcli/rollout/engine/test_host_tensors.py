"""The engine's list-to-tensor helpers give exactly what `torch.tensor` gives."""

from __future__ import annotations

import math

import torch

from srtcli.rollout.engine.host_tensors import floats, longs


def test_longs_and_floats_equal_torch_tensor():
    ints = [0, 1, -5, 2**40, 645]
    vals = [0.1, 1.0, 1e-30, math.inf, 1 / 3]
    assert torch.equal(longs(ints), torch.tensor(ints, dtype=torch.long))
    assert torch.equal(floats(vals), torch.tensor(vals, dtype=torch.float32))


def test_empty_lists_give_empty_tensors():
    assert longs([]).shape == (0,) and longs([]).dtype == torch.long
    assert floats([]).shape == (0,) and floats([]).dtype == torch.float32


def test_the_tensor_is_a_copy_of_the_list():
    ints = [1, 2, 3]
    t = longs(ints)
    t[0] = 9
    ints[1] = 7
    assert ints == [1, 7, 3] and t.tolist() == [9, 2, 3]
