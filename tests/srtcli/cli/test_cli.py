"""The `srt` entry point: version, help, and `--config` (keys are long flags; flags win); how a
run ends (usage errors in one line with exit status 1, naming a config file's line; Ctrl-C in one
line with exit status 130; srt's warnings in one line); the --json keys every command shares."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from srtcli import __version__
from srtcli.cli import LazyGroup, cli
from srtcli.cli.config import config_option


def test_version_and_help_from_the_installed_script():
    out = subprocess.run([str(Path(sys.executable).parent / "srt"), "--version"], capture_output=True, text=True, check=True)
    assert __version__ in out.stdout
    out = subprocess.run([sys.executable, "-m", "srtcli", "--help"], capture_output=True, text=True, check=True)
    assert "Usage" in out.stdout


@click.command()
@config_option
@click.option("--max-tokens", type=int, default=8192)
@click.option("--name", default="x")
@click.option("--yes", is_flag=True)
def echo(max_tokens, name, yes):
    click.echo(f"{max_tokens} {name}" + (" yes" if yes else ""))


def run_in_group(command: click.Command, args: list[str]):
    """Run a test command the way `srt` runs its subcommands (srt's errors become one line)."""
    group = LazyGroup(commands={command.name: command})
    return CliRunner().invoke(group, [command.name, *args])


def test_config_keys_are_long_flags_and_flags_win(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-tokens: 128\nname: from-file\n")
    r = run_in_group(echo, ["--config", str(cfg)])
    assert r.output.strip() == "128 from-file"
    r = run_in_group(echo, ["--config", str(cfg), "--name", "flag"])
    assert r.output.strip() == "128 flag"
    r = run_in_group(echo, ["--name", "flag", "--config", str(cfg)])
    assert r.output.strip() == "128 flag"


def test_config_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max-tokens: [1,\n")
    r = run_in_group(echo, ["--config", str(bad)])
    assert r.exit_code == 1 and "bad.yaml" in r.output and "Traceback" not in r.output
    unknown = tmp_path / "u.yaml"
    unknown.write_text("nope: 1\n")
    r = run_in_group(echo, ["--config", str(unknown)])
    assert r.exit_code == 1 and "unknown key 'nope'" in r.output
    r = run_in_group(echo, ["--config", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 1 and "not found" in r.output


def test_a_bare_yes_key_is_the_yes_flag(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("yes: true\n")
    r = run_in_group(echo, ["--config", str(cfg)])
    assert r.output.strip() == "8192 x yes"


@click.command()
@config_option
@click.option("--cache", "cache_dir", default="none")
@click.option("--run-ahead/--no-run-ahead", default=True)
def named(cache_dir, run_ahead):
    click.echo(f"{cache_dir} {run_ahead}")


def test_keys_match_flags_even_when_the_parameter_is_named_otherwise(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cache: /tmp/c\nno-run-ahead: true\n")
    r = run_in_group(named, ["--config", str(cfg)])
    assert r.output.strip() == "/tmp/c False"
    r = run_in_group(named, ["--config", str(cfg), "--run-ahead"])
    assert r.output.strip() == "/tmp/c True"


# -- how a run of `srt` ends: usage errors, Ctrl-C, warnings, the command list --------------

SRT = [sys.executable, "-m", "srtcli"]


def srt(*args: str, cwd=None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*SRT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def interruptible(cmd: list[str]) -> subprocess.Popen:
    """`cmd` started as a terminal starts it, Ctrl-C delivered: a shell without job control (a
    background `.ci/run`) passes SIGINT on ignored, and Python then never raises KeyboardInterrupt."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def one_line(r: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed run (exit status 1, nothing on stdout)."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    return r.stderr.strip()


def test_usage_errors_are_one_line_with_exit_status_1():
    assert one_line(srt("rollout", "--prompts", "p.jsonl", "-n", "0")) == \
        "Error: srt rollout: -n/--n: 0 is not in the range x>=1"
    assert one_line(srt("rollout", "--prompts", "p.jsonl", "--top-p", "2")) == \
        "Error: srt rollout: --top-p: 2.0 is not in the range 0.0<x<=1.0"
    assert one_line(srt("rollout", "--prompts", "p.jsonl", "--tempreature", "1")) == \
        "Error: srt rollout: no such option '--tempreature'; did you mean '--temperature'?"
    assert one_line(srt("rollout")) == "Error: srt rollout: missing option '--prompts'"
    assert one_line(srt("rollout", "--prompts")) == "Error: srt rollout: option '--prompts' requires an argument"
    assert one_line(srt("pack", "--steps", "a", "--out", "b", "extra")) == \
        "Error: srt pack: got unexpected extra argument (extra)"
    assert one_line(srt("cache", "prune", "--max-trees", "-1")) == \
        "Error: srt cache prune: --max-trees: -1 is not in the range x>=0"
    assert one_line(srt("cache", "export")) == "Error: srt cache export: missing argument 'OUT'"
    assert one_line(srt("train", "--out", "o", "--loss-agg", "sum")).startswith(
        "Error: srt train: --loss-agg: 'sum' is not one of ")
    assert one_line(srt("nope")) == "Error: srt: no such command 'nope'"


def test_a_bad_value_from_a_config_file_names_the_file_line_and_key(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("n: 4\n# sampling\ntemperature: -1\n")
    assert one_line(srt("rollout", "--prompts", "p.jsonl", "--config", str(cfg))) == \
        f"Error: {cfg}:3: temperature: -1.0 is not in the range x>=0.0"
    cfg.write_text("max-tokens: lots\n")
    assert one_line(srt("pack", "--steps", "s", "--out", "o", "--config", str(cfg))) == \
        f"Error: {cfg}:1: max-tokens: 'lots' is not a valid integer range"
    cfg.write_text("n: 4\nnope: 1\n")
    assert one_line(srt("rollout", "--prompts", "p.jsonl", "--config", str(cfg))) == \
        f"Error: {cfg}:2: unknown key 'nope' for `srt rollout`"
    # the same bad value given as a flag is the flag's error, not the file's
    cfg.write_text("temperature: 0.5\n")
    assert one_line(srt("rollout", "--prompts", "p.jsonl", "--config", str(cfg), "--temperature", "-2")) == \
        "Error: srt rollout: --temperature: -2.0 is not in the range x>=0.0"


def test_help_still_exits_0_and_a_bare_group_shows_its_help():
    r = srt("rollout", "--help")
    assert r.returncode == 0 and r.stdout.startswith("Usage: ") and "--prompts" in r.stdout
    r = srt("cache")
    assert r.returncode == 1 and "Usage: " in r.stderr and "stats" in r.stderr


def test_help_lists_every_command_without_importing_torch():
    code = ("import sys\nfrom srtcli.cli import main\nsys.argv = ['srt', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', sorted(m for m in ('torch', 'transformers', 'rich') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "IMPORTED []"
    listed = " ".join(r.stdout.split())  # the help wraps long lines
    from srtcli.cli import COMMANDS

    ctx = click.Context(cli)
    assert sorted(COMMANDS) == ["cache", "pack", "rollout", "train"]
    for name in COMMANDS:
        real = cli.get_command(ctx, name)  # imports the command's module: its real help
        assert f"{name} {real.help.strip().splitlines()[0]}" in listed, name


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.srtcli.rollout.engine.support import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model"), sharp=60.0)


def _prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(n)))
    return path


def _groups_in(pool: Path) -> int:
    from srtcli.pool import read_pool

    by_group: dict[str, set[str]] = {}
    for st in read_pool(pool):
        if st.meta.get("last"):
            by_group.setdefault(st.prompt_uid, set()).add(st.trajectory_id)
    return sum(len(t) == 4 for t in by_group.values())


@pytest.mark.slow
def test_ctrl_c_during_rollout_says_what_the_pool_keeps_and_how_to_resume(tmp_path, model_dir):
    prompts, pool = _prompts(tmp_path / "p.jsonl", 24), tmp_path / "pool" / "rollout.jsonl"
    cmd = [*SRT, "rollout", "--prompts", str(prompts), "--model", str(model_dir), "-n", "4", "--max-new-tokens",
           "48", "--batch-size", "4", "--out", str(tmp_path / "pool"), "--cache", str(tmp_path / "cache"), "--json"]
    proc = interruptible(cmd)
    deadline = time.time() + 120
    while time.time() < deadline and (not pool.exists() or pool.stat().st_size < 2000):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    kept = _groups_in(tmp_path / "pool")
    assert 1 <= kept < 24 and out == ""
    assert err.strip() == (f"srt rollout: interrupted; rerun with --resume to continue "
                           f"({pool} keeps {kept} complete group{'s' if kept > 1 else ''})")


@pytest.mark.slow
def test_ctrl_c_during_training_names_the_checkpoint_resume_continues_from(tmp_path, model_dir):
    from srtcli.train.checkpoint import latest_checkpoint

    prompts, out = _prompts(tmp_path / "p.jsonl", 4), tmp_path / "ckpt"
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "--model", str(model_dir), "-n", "4",
                                 "--max-new-tokens", "8", "--out", str(tmp_path / "pool"), "--draft", "none"])
    assert r.exit_code == 0, r.output
    proc = interruptible([*SRT, "train", "--steps", str(tmp_path / "pool"), "--model", str(model_dir),
                          "--out", str(out), "--batch-size", "1", "--epochs", "200", "--save-every", "1"])
    deadline = time.time() + 120
    while time.time() < deadline and latest_checkpoint(out) is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    ckpt = latest_checkpoint(out)
    assert err.strip().splitlines()[-1] == \
        f"srt train: interrupted; rerun with --resume to continue from step {int(ckpt.name[5:])} ({ckpt})"


def _big_pool(pool: Path, groups: int) -> Path:
    """A valid steps pool big enough that `srt pack` takes seconds to read and pack it."""
    pool.mkdir()
    ids, mask = list(range(5, 205)), [0] * 50 + [1] * 150
    with open(pool / "rollout.jsonl", "w") as f:
        for g in range(groups):
            for k in range(8):
                f.write(json.dumps({"prompt_uid": f"g{g}", "trajectory_id": f"g{g}-{k}", "step": 0,
                                    "input_ids": ids[:50] + [g % 600 + k] + ids[51:], "loss_mask": mask,
                                    "old_logprobs": [0.0] * 50 + [-0.5] * 150, "reward": float(k % 2)}) + "\n")
    return pool


def interrupt_while_reading(args: list[str], name: str) -> tuple[int, str]:
    """Run `srt ARGS`, send SIGINT once it has the file `name` open; (exit status, stderr)."""
    proc = interruptible([*SRT, *args])
    fds, deadline = Path(f"/proc/{proc.pid}/fd"), time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if any(target.endswith(name) for target in _open_files(fds)):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_ctrl_c_during_pack_says_rerunning_is_safe(tmp_path):
    pool, out = _big_pool(tmp_path / "pool", 1000), tmp_path / "shards"
    code, err = interrupt_while_reading(["pack", "--steps", str(pool), "--out", str(out)], "rollout.jsonl")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == \
        "srt pack: interrupted; a shard set is written whole or not at all, so rerun the same command"
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["pool"]


def test_ctrl_c_in_any_other_command_is_one_line_and_exit_130(tmp_path):
    pool = _big_pool(tmp_path / "pool", 1000)
    code, err = interrupt_while_reading(["cache", "add", str(pool), "--cache", str(tmp_path / "c"),
                                         "--tokenizer-fingerprint", "tok1-x"], "rollout.jsonl")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "srt cache add: interrupted" and "Traceback" not in err


def _open_files(fds: Path) -> list[str]:
    """What a process has open (/proc/PID/fd); entries that vanish while listed are left out."""
    out = []
    try:
        for fd in fds.iterdir():
            try:
                out.append(os.readlink(fd))
            except OSError:
                continue
    except OSError:  # the process is gone
        pass
    return out


def test_an_interrupted_run_before_any_write_says_nothing_was_written(tmp_path):
    from srtcli.rollout.plan import whole_groups

    assert whole_groups(tmp_path / "missing.jsonl") is None
    (tmp_path / "empty.jsonl").write_text("")
    assert whole_groups(tmp_path / "empty.jsonl") is None


def test_nothing_generated_means_accepted_per_forward_is_null(tmp_path, model_dir):
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    args = ["rollout", "--prompts", str(prompts), "--model", str(model_dir), "-n", "2", "--max-new-tokens", "4",
            "--out", str(tmp_path / "pool"), "--cache", str(tmp_path / "cache"), "--json"]
    first = json.loads(CliRunner().invoke(cli, args).stdout.strip().splitlines()[-1])
    assert first["accepted_per_forward"] >= 1.0
    again = json.loads(CliRunner().invoke(cli, [*args, "--resume"]).stdout.strip().splitlines()[-1])
    assert again["groups_skipped"] == 2 and again["generated_tokens"] == 0
    assert again["accepted_per_forward"] is None


def test_json_names_the_output_out_and_the_cache_cache_in_every_command(tmp_path, model_dir):
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    pool, cache, shards = tmp_path / "pool", tmp_path / "cache", tmp_path / "shards"

    def last(*args):
        r = CliRunner().invoke(cli, [*args, "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout.strip().splitlines()[-1])

    ro = last("rollout", "--prompts", str(prompts), "--model", str(model_dir), "-n", "2", "--max-new-tokens", "4",
              "--out", str(pool), "--cache", str(cache))
    assert ro["out"] == ro["pool"] == str(pool / "rollout.jsonl") and ro["cache"] == str(cache)
    none = last("rollout", "--prompts", str(prompts), "--model", str(model_dir), "-n", "2", "--max-new-tokens", "4",
                "--out", str(tmp_path / "p2"), "--draft", "none")
    assert none["cache"] is None
    assert last("pack", "--steps", str(pool), "--out", str(shards))["out"] == str(shards)
    st = last("cache", "stats", "--cache", str(cache))
    assert st["cache"] == st["path"] == str(cache)
    assert last("cache", "prune", "--cache", str(cache), "--max-trees", "9", "--dry-run")["cache"] == str(cache)
    ex = last("cache", "export", "--cache", str(cache), str(tmp_path / "exp"))
    assert (ex["cache"], ex["out"]) == (str(cache), str(tmp_path / "exp"))
    assert last("cache", "import", "--cache", str(tmp_path / "c2"), str(tmp_path / "exp"))["cache"] == \
        str(tmp_path / "c2")
    assert last("cache", "add", "--cache", str(tmp_path / "c3"), str(pool), "--model", str(model_dir))["cache"] == \
        str(tmp_path / "c3")


def test_cache_add_refuses_empty_input_before_creating_the_cache(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    r = srt("cache", "add", str(empty), "--cache", str(tmp_path / "c"), "--tokenizer-fingerprint", "tok1-x")
    assert one_line(r) == f"Error: {empty}: no rollouts to add (it is empty)"
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "rollout.jsonl").write_text("")
    r = srt("cache", "add", str(tmp_path / "pool"), "--cache", str(tmp_path / "c"), "--tokenizer-fingerprint", "t")
    assert one_line(r) == f"Error: {tmp_path / 'pool'}: no rollouts to add (it is empty)"
    empty.write_text('{"nonsense": 1}\n')
    r = srt("cache", "add", str(empty), "--cache", str(tmp_path / "c"), "--tokenizer-fingerprint", "t", "--skip-bad")
    assert one_line(r) == f"Error: {empty}: no rollouts to add (every line was bad: 1 skipped)"
    assert not (tmp_path / "c").exists()


def test_a_too_long_prompt_is_srts_one_line_without_transformers_warning(tmp_path, model_dir):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "1+1 " * 300}) + "\n")
    r = srt("rollout", "--prompts", str(long), "--model", str(model_dir), "--out", str(tmp_path / "o"),
            "--cache", str(tmp_path / "c"))
    assert one_line(r).startswith(f"Error: {long}:1: the prompt has ")


@pytest.mark.slow
def test_a_corrupt_tree_warns_in_one_srt_line(tmp_path, model_dir):
    from cache_store.seqstore import LmdbSequenceStore

    prompts = _prompts(tmp_path / "p.jsonl", 2)
    args = ["rollout", "--prompts", str(prompts), "--model", str(model_dir), "-n", "2", "--max-new-tokens", "8",
            "--cache", str(tmp_path / "cache"), "--json"]
    assert CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "p1")]).exit_code == 0
    s = LmdbSequenceStore.open(tmp_path / "cache")
    uid = s.uids()[0]
    key, rec = s.raw_records(uid)[0]
    s.put_raw(key, rec[:-5] + bytes([rec[-5] ^ 0x20]) + rec[-4:])
    s.close()
    r = srt(*args, "--out", str(tmp_path / "p2"))
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "corrupt" in line.lower()]
    assert len(warned) == 1 and warned[0].startswith("srt: warning: ") and uid in warned[0], r.stderr
    assert "CorruptSequenceWarning" not in r.stderr and "warn(" not in r.stderr
