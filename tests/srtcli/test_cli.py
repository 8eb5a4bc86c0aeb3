"""The `srt` entry point: version, help, and `--config` (keys are long flags; flags win)."""

import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from srtcli import __version__
from srtcli.cli import cli
from srtcli.config import config_option


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


def test_config_keys_are_long_flags_and_flags_win(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-tokens: 128\nname: from-file\n")
    r = CliRunner().invoke(echo, ["--config", str(cfg)])
    assert r.output.strip() == "128 from-file"
    r = CliRunner().invoke(echo, ["--config", str(cfg), "--name", "flag"])
    assert r.output.strip() == "128 flag"
    r = CliRunner().invoke(echo, ["--name", "flag", "--config", str(cfg)])
    assert r.output.strip() == "128 flag"


def test_config_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max-tokens: [1,\n")
    r = CliRunner().invoke(echo, ["--config", str(bad)])
    assert r.exit_code == 1 and "bad.yaml" in r.output and "Traceback" not in r.output
    unknown = tmp_path / "u.yaml"
    unknown.write_text("nope: 1\n")
    r = CliRunner().invoke(echo, ["--config", str(unknown)])
    assert r.exit_code == 1 and "unknown key 'nope'" in r.output
    r = CliRunner().invoke(echo, ["--config", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 1 and "not found" in r.output


def test_a_bare_yes_key_is_the_yes_flag(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("yes: true\n")
    r = CliRunner().invoke(echo, ["--config", str(cfg)])
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
    r = CliRunner().invoke(named, ["--config", str(cfg)])
    assert r.output.strip() == "/tmp/c False"
    r = CliRunner().invoke(named, ["--config", str(cfg), "--run-ahead"])
    assert r.output.strip() == "/tmp/c True"
