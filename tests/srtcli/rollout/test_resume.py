"""One writer per pool, and `--resume` continues only the run that started the pool.

Real `srt rollout` processes on the bundled model: a second writer is refused at once while the
first holds the pool (the first is paused with SIGSTOP so the overlap is certain), a SIGKILLed
writer never blocks the next run, a resumed run with another model, prompts file or sampling
option is refused in one line and leaves the pool as it was, speed-only options may change, and
a pool written before run records existed still resumes, with a note; one that holds a group
twice (as two writers at once used to leave it) is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.models import default_model_dir
from srtcli.pool import read_pool

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
K = 2


@pytest.fixture
def prompts(tmp_path) -> Path:
    lines = (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:16]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def args(tmp_path: Path, prompts: Path, *extra: str) -> list[str]:
    return ["rollout", "--prompts", str(prompts), "-n", str(K), "--max-new-tokens", "32",
            "--out", str(tmp_path / "pool"), "--cache", str(tmp_path / "cache"), "--json", *extra]


def srt_process(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "srtcli", *argv], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_lock(proc: subprocess.Popen, pool_file: Path) -> None:
    """Until `proc` holds the pool's lock (it writes its pid into the lock file when it does)."""
    lock = pool_file.parent / f".{pool_file.name}.lock"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if lock.exists() and lock.read_text().strip() == str(proc.pid):
            return
        time.sleep(0.02)
    raise AssertionError(f"the writer never took the lock (exit {proc.poll()})")


def assert_each_group_once(pool: Path, n_groups: int) -> None:
    steps = read_pool(pool)  # refuses a (prompt, trajectory, step) written twice
    groups: dict[str, set[str]] = {}
    for s in steps:
        if s.meta.get("last"):
            groups.setdefault(s.prompt_uid, set()).add(s.trajectory_id)
    assert len(groups) == n_groups and all(len(t) == K for t in groups.values())
    assert len(steps) == len({(s.prompt_uid, s.trajectory_id, s.step) for s in steps})


def one_line_refusal(r: subprocess.CompletedProcess | Result, *needles: str) -> None:
    out = (r.stdout or "") + (r.stderr or "")
    assert r.returncode == 1, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    for n in needles:
        assert n in out, out


def run(tmp_path, prompts, *extra):
    return CliRunner().invoke(cli, args(tmp_path, prompts, *extra))


class Result:
    """A CliRunner result read like a finished process."""

    def __init__(self, r):
        self.returncode, self.stdout, self.stderr = r.exit_code, r.stdout, r.stderr


@pytest.mark.slow  # two interpreters start (about 4 s each on a busy 2-core machine)
def test_a_second_writer_is_refused_while_the_first_holds_the_pool(tmp_path, prompts):
    pool_file = tmp_path / "pool" / "rollout.jsonl"
    first = srt_process(args(tmp_path, prompts, "--resume"))
    try:
        wait_for_lock(first, pool_file)
        first.send_signal(signal.SIGSTOP)  # holds the lock, certainly still running
        r = subprocess.run([sys.executable, "-m", "srtcli", *args(tmp_path, prompts, "--resume")], env=ENV,
                           capture_output=True, text=True, timeout=120)
        one_line_refusal(r, str(pool_file), "another srt rollout is writing this pool", f"pid {first.pid}")
        # without --resume too (this test's own process is the second writer this time)
        r = Result(run(tmp_path, prompts))
        one_line_refusal(r, str(pool_file), "another srt rollout is writing this pool", f"pid {first.pid}")
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["groups_skipped"] == 0
    assert_each_group_once(tmp_path / "pool", 16)
    assert sorted(p.name for p in pool_file.parent.iterdir()) == ["rollout.jsonl", "rollout.jsonl.run.json"]


def test_a_sigkilled_writers_lock_does_not_block_the_next_run(tmp_path, prompts):
    pool_file = tmp_path / "pool" / "rollout.jsonl"
    killed = srt_process(args(tmp_path, prompts))
    wait_for_lock(killed, pool_file)
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert (pool_file.parent / ".rollout.jsonl.lock").exists()  # left behind, but no longer locked
    r = run(tmp_path, prompts, "--resume")  # in this test's own process
    assert r.exit_code == 0, r.output
    assert_each_group_once(tmp_path / "pool", 16)
    assert not (pool_file.parent / ".rollout.jsonl.lock").exists()


def test_resume_refuses_a_changed_run_and_accepts_speed_only_changes(tmp_path, prompts):
    assert run(tmp_path, prompts).exit_code == 0
    pool_file = tmp_path / "pool" / "rollout.jsonl"
    before = pool_file.read_bytes()
    other_model = shutil.copytree(default_model_dir(), tmp_path / "other-model")
    (other_model / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    other_prompts = tmp_path / "other.jsonl"
    other_prompts.write_text(prompts.read_text().replace("pens", "pencils"))
    changed = {
        ("--temperature", "0.7"): "--temperature: recorded 1.0, now 0.7",
        ("--max-new-tokens", "16"): "--max-new-tokens: recorded 32, now 16",
        ("-n", "3"): "-n: recorded 2, now 3",
        ("--seed", "4"): "--seed: recorded 0, now 4",
        ("--top-k", "5"): "--top-k: recorded 0, now 5",
        ("--tools", "none"): "--tools: recorded calculator, now none",
        ("--model", str(other_model)): f"--model: recorded {default_model_dir()}",
    }
    for flags, says in changed.items():
        one_line_refusal(Result(run(tmp_path, prompts, "--resume", *flags)), "cannot resume a changed run", says)
    r = CliRunner().invoke(cli, args(tmp_path, other_prompts, "--resume"))
    one_line_refusal(Result(r), f"--prompts: recorded {prompts}", f"now {other_prompts}")
    assert pool_file.read_bytes() == before
    # the samples do not depend on these: they may change on resume
    speed = ["--resume", "--batch-size", "3", "--draft", "none", "--budget", "2", "--cache", str(tmp_path / "c2"),
             "--device", "cpu", "--threads", "2", "--rollout-batch", "4"]
    r = run(tmp_path, prompts, *speed)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["groups_skipped"] == 16
    moved = tmp_path / "moved.jsonl"  # the prompts are recorded by content, not by path
    shutil.copy(prompts, moved)
    assert CliRunner().invoke(cli, args(tmp_path, moved, "--resume")).exit_code == 0


def test_a_pool_without_a_run_record_resumes_with_a_note(tmp_path, prompts):
    assert run(tmp_path, prompts).exit_code == 0
    (tmp_path / "pool" / "rollout.jsonl.run.json").unlink()  # as an older srt left it
    r = run(tmp_path, prompts, "--resume", "--temperature", "0.5")
    assert r.exit_code == 0, r.output
    note = [line for line in r.stderr.splitlines() if "run record" in line]
    assert len(note) == 1 and "options could not be checked" in note[0]
    assert not (tmp_path / "pool" / "rollout.jsonl.run.json").exists()  # unknown stays unknown


def test_a_refused_start_leaves_no_pool_directory(tmp_path, prompts):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"\n')
    r = CliRunner().invoke(cli, args(tmp_path, bad))
    assert r.exit_code == 1 and "bad.jsonl:1:" in r.output
    assert not (tmp_path / "pool").exists()


def test_resume_refuses_a_pool_that_holds_a_group_twice(tmp_path, prompts):
    assert run(tmp_path, prompts).exit_code == 0
    pool_file = tmp_path / "pool" / "rollout.jsonl"
    lines = pool_file.read_bytes().splitlines(keepends=True)
    first_group = [x for x in lines if json.loads(x)["prompt_uid"] == json.loads(lines[0])["prompt_uid"]]
    with open(pool_file, "ab") as f:  # what two writers at once used to leave
        f.writelines(first_group)
    before = pool_file.read_bytes()
    one_line_refusal(Result(run(tmp_path, prompts, "--resume")), f"{pool_file}:{len(lines) + 1}:", "appears twice")
    assert pool_file.read_bytes() == before
