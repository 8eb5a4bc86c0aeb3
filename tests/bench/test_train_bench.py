"""`train_bench.py`: the few-shot scenario shares one untrained prefix, forward tokens count
padding, and a tiny run (gradient checkpointing, micro-batches, a pool) prints every figure."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.train_bench import fewshot_steps, forward_tokens, synthetic_steps, work_rows

ROOT = Path(__file__).resolve().parents[2]


def test_fewshot_puts_one_untrained_prefix_before_the_first_groups():
    steps = synthetic_steps(3, 5, 4, 50) + [s for s in synthetic_steps(2, 5, 4, 50, seed=1)]
    for s in steps[3:]:
        s.prompt_uid = "q"
    originals = [list(s.input_ids) for s in steps]
    out = fewshot_steps(steps, prefix_tokens=7, groups=1)
    prefix = originals[0][:7]
    assert [s.prompt_uid for s in out] == ["p"] * 3
    for s, ids in zip(out, originals):
        assert s.input_ids == prefix + ids and s.loss_mask[:7] == [0] * 7 and len(s.old_logprobs) == len(s.input_ids)


def test_forward_tokens_count_a_padded_micro_batch_at_its_longest_sequence():
    steps = synthetic_steps(2, 3, 4, 50)
    steps[1].input_ids = steps[1].input_ids[:5]
    steps[1].loss_mask, steps[1].old_logprobs = steps[1].loss_mask[:5], steps[1].old_logprobs[:5]
    rows = work_rows(steps, "padded")
    assert forward_tokens(rows, "padded", 1 << 30) == 2 * 7
    assert forward_tokens(rows, "single", 1 << 30) == 7 + 5
    assert forward_tokens(work_rows(steps, "packed"), "packed", 1 << 30) == 128  # one row, padded to 128


@pytest.mark.parametrize("repeats", ["1", "0"])  # 0: each mode timed in its memory run
def test_a_tiny_run_prints_every_figure(repeats):
    cmd = [sys.executable, "bench/train_bench.py", "--scenarios", "4/32/16", "--repeats", repeats, "--warmup", "0",
           "--hidden", "32", "--layers", "1", "--vocab", "64", "--gradient-checkpointing", "--micro-batch-tokens", "64"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "(gradient checkpointing)" in out
    for mode in ("packed", "padded", "single"):
        assert f"4/32/16      {mode}" in out
    assert "token ratio" in out and "forward tokens packed/padded" in out
