"""Data parallel: 2 CPU processes (gloo) equal 1 process on the same global batch.

Two levels: the gradient itself (two spawned ranks running `step_gradients`, summed with a real
all-reduce), including a wrong variant that normalises by per-rank counts and must fail; and
the whole command, `srt train --nproc 2` (which runs torchrun) against a single process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from srtcli.train import dist
from srtcli.train.loss import LossConfig
from srtcli.train.data import load_packed, load_steps, split_ranks
from tests.srtcli.train.fixtures import grads, model_dir, pack_pool, rel_diff, scenario, write_pool

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    model = model_dir(root / "model")
    steps = scenario("many_groups_per_row", model) + scenario("multi_turn", model, seed=2)
    pool = write_pool(steps, root / "pool")
    # small rows, so both ranks get several
    return {"model": model, "pool": pool, "shards": pack_pool(pool, root / "shards", 48), "root": root}


def _rows(kind: str, path: str):
    return load_steps(Path(path)).rows if kind == "steps" else load_packed(Path(path)).rows


CASES = [("steps", "token-mean", False), ("shards", "token-mean", False), ("steps", "seq-mean-token-mean", False),
         ("shards", "seq-mean-token-mean", False), ("steps", "token-mean", True), ("shards", "token-mean", True)]


def _worker(rank: int, store: str, model: str, pool: str, shards: str, out: str):
    """Every case on two gloo ranks, in one spawn (process start-up dominates on 2 cores)."""
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    real = dist.all_reduce_sum
    results = {}
    try:
        for kind, agg, wrong in CASES:
            # wrong: the classic bug, each rank divides by its own token / sequence counts
            dist.all_reduce_sum = (lambda info, v: list(v) if len(v) == 2 else real(info, v)) if wrong else real
            info = dist.DistInfo(rank=rank, world=2)
            rows = _rows(kind, pool if kind == "steps" else shards)
            results[(kind, agg, wrong)] = grads(Path(model), rows, LossConfig(agg=agg), micro=64, info=info)
        if rank == 0:
            torch.save(results, out)
        tdist.barrier()  # leave together, as `srt train` does (srtcli/cli/train.py)
    finally:
        dist.all_reduce_sum = real
        tdist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(setup):
    out = setup["root"] / "two_ranks.pt"
    args = (str(setup["root"] / "store"), str(setup["model"]), str(setup["pool"]), str(setup["shards"]), str(out))
    mp.spawn(_worker, args=args, nprocs=2)
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["steps", "shards"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_ranks_equal_one(setup, two_ranks, kind, agg):
    rows = _rows(kind, setup["pool"] if kind == "steps" else setup["shards"])
    assert all(split_ranks(rows, 2))  # both ranks have work
    want_loss, want = grads(setup["model"], rows, LossConfig(agg=agg))
    loss, got = two_ranks[(kind, agg, False)]
    assert loss == pytest.approx(want_loss, rel=TOL) and rel_diff(got, want) <= TOL
    if (kind, agg, True) in two_ranks:
        _, bad = two_ranks[(kind, agg, True)]
        assert rel_diff(bad, want) > 100 * TOL


def _srt_json(args):
    r = subprocess.run([sys.executable, "-m", "srtcli", "train", *map(str, args), "--json"],
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _common(setup):
    return ["--shards", setup["shards"], "--model", setup["model"], "--lr", "1e-2", "--epochs", "2",
            "--micro-batch-tokens", "64", "--loss-agg", "seq-mean-token-sum", "--kl-coef", "0.1"]


@pytest.fixture(scope="module")
def one_process(setup):
    from click.testing import CliRunner

    from srtcli.cli import cli

    out = setup["root"] / "one"
    r = CliRunner().invoke(cli, ["train", *map(str, _common(setup)), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1]), out


def _same_run(one, out_one, two, out_two):
    assert two["world"] == 2 and one["world"] == 1
    assert two["loss"] == pytest.approx(one["loss"], rel=TOL) and two["grad_norm"] == pytest.approx(one["grad_norm"], rel=TOL)
    assert two["last_loss"] == pytest.approx(one["last_loss"], rel=1e-4)
    w1, w2 = load_file(str(out_one / "model.safetensors")), load_file(str(out_two / "model.safetensors"))
    assert w1.keys() == w2.keys() and max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= 1e-5
    m1 = [json.loads(x) for x in (out_one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (out_two / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in m2] == [m["step"] for m in m1] == [1, 2]
    assert [m["tokens"] for m in m2] == [m["tokens"] for m in m1] and m2[1]["kl"] == pytest.approx(m1[1]["kl"], rel=1e-4)


@pytest.mark.slow
def test_nproc_2_command_equals_one_process(setup, one_process, tmp_path):
    two = _srt_json([*_common(setup), "--out", tmp_path / "two", "--nproc", "2"])
    _same_run(*one_process, two, tmp_path / "two")


@pytest.mark.slow
def test_fsdp_with_a_resume_equals_one_process(setup, one_process, tmp_path):
    """FSDP2 on 2 gloo ranks: stop after step 1 (a gathered checkpoint), resume, compare."""
    args = [*_common(setup), "--out", tmp_path / "fsdp", "--nproc", "2", "--fsdp"]
    first = _srt_json([*args, "--max-steps", "1"])
    assert first["fsdp"] and first["steps"] == 1
    # the gathered checkpoint also resumes unsharded, in one process
    import shutil

    from click.testing import CliRunner

    from srtcli.cli import cli

    shutil.copytree(tmp_path / "fsdp", tmp_path / "plain")
    r = CliRunner().invoke(cli, ["train", *map(str, _common(setup)), "--out", str(tmp_path / "plain"), "--resume", "--json"])
    assert r.exit_code == 0, r.output
    plain = json.loads(r.stdout.strip().splitlines()[-1])
    plain["loss"], plain["grad_norm"], plain["world"] = first["loss"], first["grad_norm"], 2
    _same_run(*one_process, plain, tmp_path / "plain")
    two = _srt_json([*args, "--resume"])
    assert two["steps_run"] == 1
    two["loss"], two["grad_norm"] = first["loss"], first["grad_norm"]  # the first step ran in the first launch
    _same_run(*one_process, two, tmp_path / "fsdp")
    r = subprocess.run([sys.executable, "-m", "srtcli", "train", *map(str, _common(setup)), "--out", tmp_path / "x", "--fsdp"],
                       env=ENV, capture_output=True, text=True)
    assert r.returncode == 1 and "--nproc" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_fsdp_with_gradient_checkpointing_equals_one_process(setup, one_process, tmp_path):
    two = _srt_json([*_common(setup), "--out", tmp_path / "two", "--nproc", "2", "--fsdp", "--gradient-checkpointing"])
    _same_run(*one_process, two, tmp_path / "two")
