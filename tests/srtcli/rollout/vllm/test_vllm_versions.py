"""The supported vLLM range (srtcli.rollout.vllm.versions): releases inside it pass, the rest get
one line naming the installed version and the range, from `srt rollout --engine vllm` and from
the drop-in `speculative_config`, before vLLM is imported. Runs in any venv: the installed release
is what a distribution's metadata on the path says (a dist-info directory, as pip writes it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from srtcli.errors import SrtError
from srtcli.rollout.vllm import versions
from srtcli.rollout.vllm.proposer import speculative_config

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("version", ["0.22.0", "0.26.0+cpu", "0.32.0", "0.33.1"])
def test_releases_that_have_srts_interface_pass(version):
    assert versions.refusal(version) is None


@pytest.mark.parametrize("version", ["0.21.0", "0.8.5", "0.34.0", "0.34.0.dev12+g1a2b3c", "1.0.0", "unknown"])
def test_releases_without_it_get_one_line_naming_version_and_range(version):
    why = versions.refusal(version)
    assert why is not None and "\n" not in why
    assert f"vLLM {version} is installed" in why and versions.SUPPORTED_TEXT in why


def installed(tmp_path: Path, version: str) -> Path:
    """A site directory where pip would have installed vLLM `version` (its metadata only)."""
    info = tmp_path / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return tmp_path


def test_the_drop_in_config_refuses_an_unsupported_install(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(installed(tmp_path, "0.34.0")))
    with pytest.raises(SrtError, match=r"vLLM 0\.34\.0 is installed"):
        speculative_config(8)
    monkeypatch.setenv(versions.ANY_VERSION_ENV, "1")
    assert speculative_config(8)["method"] == "custom_class"


def test_srt_rollout_on_an_unsupported_vllm_stops_with_one_line(tmp_path):
    site = installed(tmp_path / "site", "0.34.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    r = subprocess.run([sys.executable, "-m", "srtcli", "rollout", "--engine", "vllm",
                        "--prompts", str(ROOT / "examples/arith/prompts.jsonl"), "--out", str(tmp_path / "pool"),
                        "--cache", str(tmp_path / "cache")], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "vLLM 0.34.0 is installed" in r.stderr and "0.22.0 to 0.33.x" in r.stderr
    assert not (tmp_path / "pool").exists()


DROP_IN = """
import sys
from vllm import LLM
LLM(sys.argv[1], dtype="float32", max_model_len=128, max_num_seqs=2, enforce_eager=True,
    speculative_config={"method": "custom_class", "model": "srtcli.rollout.vllm.proposer.SrtProposer",
                        "num_speculative_tokens": 4})
"""


@pytest.mark.slow
def test_the_drop_in_proposer_stops_an_unsupported_vllm_with_the_same_line(tmp_path):
    """vLLM (the one installed, its version taken for 0.34.0; "+cpu" keeps vLLM on its CPU platform,
    which it tells by that version) builds the proposer in its worker, which refuses; vLLM
    reports the line as the reason the proposer could not be built."""
    pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
    from srtcli.tiny_model import make_head32_model_dir

    model = make_head32_model_dir(tmp_path / "model")
    site = installed(tmp_path / "site", "0.34.0+cpu")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "VLLM_CPU_KVCACHE_SPACE": "1",
           "SRT_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", DROP_IN, str(model)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    log = r.stdout + r.stderr  # vLLM logs to stdout unless told otherwise
    assert r.returncode != 0
    assert "vLLM 0.34.0+cpu is installed; srt's vLLM proposer supports vLLM 0.22.0 to 0.33.x" in log, log[-3000:]
    assert not (tmp_path / "cache").exists()  # refused before anything was opened
