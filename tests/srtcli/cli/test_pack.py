"""`srt pack`: pool -> shards, round trip, exactness through shards, bad input, kills."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from srtcli.advantages import grpo_advantages
from srtcli.cli import cli
from srtcli.pool import PoolWriter, StepRecord, read_pool
from srtcli.shards import load_shards

torch.set_num_threads(1)


def write_pool(path: Path, prompts: int = 3, trajs: int = 4, turns: int = 2, seed: int = 0, vocab: int = 100) -> list[StepRecord]:
    """Multi-turn steps: each trajectory's step k+1 extends step k; one explicit advantage."""
    rng = random.Random(seed)
    steps = []
    path.mkdir(parents=True, exist_ok=True)
    with PoolWriter(path / "a.jsonl") as w:
        for p in range(prompts):
            prompt = [rng.randrange(vocab) for _ in range(10)]
            for t in range(trajs):
                seq, mask = list(prompt), [0] * 10
                for k in range(turns):
                    resp = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
                    tool = [rng.randrange(vocab) for _ in range(2)]
                    seq, mask = seq + resp, mask + [1] * len(resp)
                    s = StepRecord(
                        f"p{p}", f"t{t}", k, list(seq), list(mask),
                        [round(-rng.random(), 6) if m else 0.0 for m in mask], float(rng.randint(0, 1)),
                        advantage=0.25 if (p, t) == (0, 0) else None, meta={"sample": t},
                    )
                    w.write(s)
                    steps.append(s)
                    seq, mask = seq + tool, mask + [0, 0]
    return steps


def run(args):
    return CliRunner().invoke(cli, ["pack", *map(str, args)])


def leftovers(parent: Path, name: str):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_round_trip_carries_everything_training_needs(tmp_path):
    steps = write_pool(tmp_path / "pool")
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--max-tokens", 64, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    for key in ("sequences", "original_tokens", "packed_tokens", "token_ratio", "rows"):
        assert key in out
    assert out["sequences"] == len(steps) == 24
    assert out["original_tokens"] == sum(len(s.input_ids) for s in steps)
    assert out["token_ratio"] == pytest.approx(out["packed_tokens"] / out["original_tokens"], abs=1e-6)
    manifest, rows = load_shards(tmp_path / "shards")
    assert len(rows) == out["rows"] == manifest["rows"]
    advs = dict(zip([(s.prompt_uid, s.trajectory_id, s.step) for s in steps], grpo_advantages(steps)))
    assert advs[("p0", "t0", 0)] == 0.25
    got = {}
    for sr in rows:
        assert len(sr.steps) == len(sr.row.paths)
        assert len(sr.row) % 128 == 0 and sr.row.n_real <= 64
        for st, path in zip(sr.steps, sr.row.paths):
            assert sr.row.input_ids[path].tolist() == st.input_ids
            got[(st.prompt_uid, st.trajectory_id, st.step)] = st
    assert len(got) == len(steps)
    for s in steps:
        g = got[(s.prompt_uid, s.trajectory_id, s.step)]
        assert (g.input_ids, g.loss_mask, g.old_logprobs, g.reward, g.meta) == (
            s.input_ids, s.loss_mask, s.old_logprobs, s.reward, s.meta)
        assert g.advantage == advs[(s.prompt_uid, s.trajectory_id, s.step)]
    # the human summary
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "s2"])
    assert r.exit_code == 0 and "token ratio" in r.output and "rows" in r.output


def test_shard_rows_give_exact_logprobs(tmp_path):
    from attention import row_logprobs
    from tests.attention.conftest import max_diff, separate_logprobs, tiny_model

    write_pool(tmp_path / "pool", prompts=2, trajs=3)
    assert run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--max-tokens", 48]).exit_code == 0
    _, rows = load_shards(tmp_path / "shards")
    model = tiny_model("qwen2")
    with torch.no_grad():
        for sr in rows:
            got = row_logprobs(model, sr.row)
            assert max_diff(got, [separate_logprobs(model, s.input_ids) for s in sr.steps]) <= 1e-4


def test_config_file_and_json_last_line(tmp_path):
    write_pool(tmp_path / "pool")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"steps: {tmp_path / 'pool'}\nout: {tmp_path / 'shards'}\nmax-tokens: 40\npad-to: 8\njson: true\n")
    r = run(["--config", cfg])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["max_tokens"] == 40 and out["pad_to"] == 8


BAD = {
    "malformed": '{"prompt_uid": "p", oops\n',
    "missing": json.dumps({"prompt_uid": "p", "trajectory_id": "t", "step": 0, "input_ids": [1, 2]}) + "\n",
    "lengths": json.dumps({"prompt_uid": "p", "trajectory_id": "t", "step": 0, "input_ids": [1, 2],
                           "loss_mask": [0, 1, 1], "old_logprobs": [0, 0], "reward": 1}) + "\n",
    "negative": json.dumps({"prompt_uid": "p", "trajectory_id": "t", "step": 0, "input_ids": [1, -2],
                            "loss_mask": [0, 1], "old_logprobs": [0, 0], "reward": 1}) + "\n",
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_lines_are_one_line_errors_and_leave_nothing(tmp_path, kind):
    steps = write_pool(tmp_path / "pool", prompts=1, trajs=1, turns=2)
    f = tmp_path / "pool" / "a.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text(lines[0] + BAD[kind] + lines[1])
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards"])
    assert r.exit_code == 1
    assert "a.jsonl:2:" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "shards").exists() and leftovers(tmp_path, "shards") == []
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--skip-bad", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["skipped"] == 1 and out["sequences"] == len(steps)


def test_empty_pool_and_too_long_steps(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run(["--steps", tmp_path / "empty", "--out", tmp_path / "shards"])
    assert r.exit_code == 1 and "empty" in r.output and not (tmp_path / "shards").exists()
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.jsonl").write_text("\n\n")
    r = run(["--steps", tmp_path / "blank", "--out", tmp_path / "shards"])
    assert r.exit_code == 1 and "no valid step" in r.output
    write_pool(tmp_path / "pool", prompts=1, trajs=2)
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--max-tokens", 15])
    assert r.exit_code == 1 and "prompt_uid='p0'" in r.output and "--max-tokens 15" in r.output
    assert not (tmp_path / "shards").exists()
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--max-tokens", 15, "--skip-bad", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["skipped"] >= 1


def test_existing_output_is_kept_unless_overwrite_and_then_replaced_whole(tmp_path):
    write_pool(tmp_path / "pool")
    assert run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards"]).exit_code == 0
    before = sorted(p.name for p in (tmp_path / "shards").iterdir())
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards"])
    assert r.exit_code == 1 and "already exists" in r.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jsonl").write_text("not json\n")
    r = run(["--steps", tmp_path / "bad", "--out", tmp_path / "shards", "--overwrite"])
    assert r.exit_code == 1
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == before  # old set untouched
    r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--overwrite", "--rows-per-shard", 1, "--max-tokens", 40, "--json"])
    assert r.exit_code == 0
    assert json.loads(r.output.strip().splitlines()[-1])["shards"] > 1
    assert leftovers(tmp_path, "shards") == []
    load_shards(tmp_path / "shards")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def refused(args, why: str):
    r = run(args)
    assert r.exit_code == 1 and why in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    return r


def test_overwrite_never_deletes_the_input_or_anything_but_a_shard_set(tmp_path):
    proj = tmp_path / "proj"
    write_pool(proj / "pool")
    (proj / "notes.txt").write_text("mine")
    before = snapshot(proj)
    refused(["--steps", proj / "pool", "--out", proj, "--overwrite"], "holds the input")
    refused(["--steps", proj / "pool", "--out", proj / "pool", "--overwrite"], "holds the input")
    assert snapshot(proj) == before
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "data.txt").write_text("keep")
    refused(["--steps", proj / "pool", "--out", tmp_path / "work", "--overwrite"], "not a shard set")
    assert (tmp_path / "work" / "data.txt").read_text() == "keep"
    (tmp_path / "file").write_text("a regular file")
    refused(["--steps", proj / "pool", "--out", tmp_path / "file", "--overwrite"], "not a directory")
    assert (tmp_path / "file").read_text() == "a regular file"


def test_overwrite_refuses_a_shard_set_holding_other_files(tmp_path):
    write_pool(tmp_path / "pool")
    out = tmp_path / "shards"
    assert run(["--steps", tmp_path / "pool", "--out", out]).exit_code == 0
    for extra in ("notes.txt", "sub/x"):
        (out / extra).parent.mkdir(exist_ok=True)
        (out / extra).write_text("mine")
        before = snapshot(out)
        refused(["--steps", tmp_path / "pool", "--out", out, "--overwrite"], "not part of a shard set")
        assert snapshot(out) == before
        (out / extra).unlink()
    (out / "sub").rmdir()
    assert run(["--steps", tmp_path / "pool", "--out", out, "--overwrite"]).exit_code == 0


def test_broken_shard_sets_are_one_line_errors(tmp_path):
    from srtcli.errors import SrtError

    with pytest.raises(SrtError, match="manifest.json: missing"):
        load_shards(tmp_path)
    write_pool(tmp_path / "pool")
    assert run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards"]).exit_code == 0
    (tmp_path / "shards" / "shard-00000.safetensors").write_bytes(b"garbage")
    with pytest.raises(SrtError, match="not a readable shard"):
        load_shards(tmp_path / "shards")


@pytest.mark.slow
def test_a_run_killed_mid_write_leaves_no_shard_set(tmp_path):
    rng = random.Random(1)
    (tmp_path / "pool").mkdir()
    with PoolWriter(tmp_path / "pool" / "a.jsonl", fsync_every=10**6) as w:
        for p in range(800):
            prompt = [rng.randrange(1000) for _ in range(20)]
            for k in range(4):
                seq = prompt + [rng.randrange(1000) for _ in range(10)]
                w.write(StepRecord(f"p{p}", f"t{k}", 0, seq, [0] * 20 + [1] * 10, [0.0] * 20 + [-0.5] * 10, float(k)))
    out = tmp_path / "shards"
    cmd = [sys.executable, "-m", "srtcli", "pack", "--steps", str(tmp_path / "pool"), "--out", str(out),
           "--max-tokens", "64", "--rows-per-shard", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:
        while time.time() < deadline:  # wait until shard files are being written
            temps = [p for p in tmp_path.iterdir() if p.name.startswith(".shards.tmp-")]
            if temps and len(list(temps[0].glob("shard-*"))) >= 20:
                break
            assert proc.poll() is None, "the run finished before it could be killed; make the pool bigger"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not out.exists()  # nothing half-written where training would look
    assert leftovers(tmp_path, "shards")  # only the hidden temporary directory
    r = run(["--steps", tmp_path / "pool", "--out", out, "--max-tokens", 64, "--rows-per-shard", 400, "--json"])
    assert r.exit_code == 0, r.output
    assert leftovers(tmp_path, "shards") == []  # the next run removes the dead run's temporary set
    _, rows = load_shards(out)
    assert sum(len(sr.steps) for sr in rows) == 3200


def test_shard_files_get_the_modes_the_umask_gives_when_the_set_is_written(tmp_path):
    write_pool(tmp_path / "pool")
    old = os.umask(0o027)  # set after srtcli.shards was imported: the write must see this one
    try:
        r = run(["--steps", tmp_path / "pool", "--out", tmp_path / "shards", "--rows-per-shard", 1, "--max-tokens", 40])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "shards").iterdir()}
    assert len(modes) > 2 and set(modes.values()) == {0o640}
    assert (tmp_path / "shards").stat().st_mode & 0o777 == 0o750


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_directory_filled_while_packing_is_refused_and_kept(tmp_path, overwrite):
    """`--out` is checked before the pool is read; a directory someone filled in the meantime
    is still refused when the set is put in place (with --overwrite too: it is not a shard set)."""
    from srtcli.errors import SrtError
    from srtcli.pack import build_rows
    from srtcli.shards import check_out, write_shards

    out = tmp_path / "shards"
    target = check_out(out, overwrite=overwrite)
    rows, summary = build_rows(write_pool(tmp_path / "pool"), 64, 8)
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SrtError, match="not a shard set" if overwrite else "already exists"):
        write_shards(target, rows, summary)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert leftovers(tmp_path, "shards") == []
