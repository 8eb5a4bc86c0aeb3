"""The contract check (srtcli.rollout.vllm.contract) against the installed vLLM's own source: it
fits, and each thing a vLLM release could change breaks exactly the point that names it (the
installed files copied and edited one at a time, and read from a wheel as `pip download` gives it).
Skipped where vLLM is not installed (its own venv; docs/vllm.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")

from srtcli.rollout.vllm import contract  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]


def test_the_installed_vllm_fits_srts_proposer():
    assert contract.failures(contract.Source()) == []
    r = subprocess.run([sys.executable, "-m", "srtcli.rollout.vllm.contract"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "fits srt's proposer" in r.stdout, r.stdout + r.stderr


@pytest.fixture
def copy_of_vllm(tmp_path) -> Path:
    """The files the check reads, copied from the installed vLLM into tmp_path/vllm/..."""
    installed = contract.Source().where
    for rel in contract.FILES:
        if (installed / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(installed / rel, tmp_path / rel)
    return tmp_path


def edit(root: Path, rel: str, old: str, new: str) -> None:
    text = (root / rel).read_text()
    assert old in text, f"{rel} no longer holds {old!r}: update this test's edit"
    (root / rel).write_text(text.replace(old, new))


# (file, text in the installed release, text a changed release could have, the point that must fail)
CHANGES = [
    (contract.SPEC_CONFIG, '"custom_class",', "", "custom_class is a speculative method"),
    (contract.BUILDER, "user_class(vllm_config)", "user_class(vllm_config, device)",
     "the proposer is built as cls(vllm_config)"),
    (contract.RUNNER, "self.input_batch.token_ids_cpu,\n                slot_mappings=slot_mappings,",
     "self.input_batch.token_ids_cpu,\n                slot_mappings=slot_mappings, num_rejected=None,",
     "propose is called with the arguments srt's propose takes"),
    (contract.RUNNER, "sampled_token_ids,\n                self.input_batch.num_tokens_no_spec,",
     "self.input_batch,\n                self.input_batch.num_tokens_no_spec,",
     "propose is called with the arguments srt's propose takes"),
    (contract.INPUT_BATCH, "def req_ids(self)", "def request_ids(self)",
     "InputBatch has req_ids, num_tokens_no_spec, token_ids_cpu"),
    (contract.PARALLEL_CONFIG, "worker_extension_cls: str", "worker_extension: str",
     "the worker extension hook exists"),
]


@pytest.mark.parametrize("rel, old, new, point", CHANGES, ids=[c[3] + ": " + c[2][:30] for c in CHANGES])
def test_each_change_fails_the_point_that_names_it(copy_of_vllm, rel, old, new, point):
    assert contract.failures(contract.Source(copy_of_vllm)) == []
    edit(copy_of_vllm, rel, old, new)
    failed = contract.failures(contract.Source(copy_of_vllm))
    assert [f.split(": ")[0] for f in failed] == [point], failed


def test_a_wheel_is_read_as_pip_download_gives_it(copy_of_vllm, tmp_path):
    edit(copy_of_vllm, contract.SPEC_CONFIG, '"custom_class",', "")
    wheel = tmp_path / "vllm-0.99.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for rel in contract.FILES:
            if (copy_of_vllm / rel).is_file():
                z.write(copy_of_vllm / rel, rel)
    r = subprocess.run([sys.executable, "-m", "srtcli.rollout.vllm.contract", str(wheel)], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stdout + r.stderr
    assert "FAILS custom_class is a speculative method" in lines[0] and str(wheel) in lines[0]
