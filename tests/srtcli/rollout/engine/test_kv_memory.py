"""The engine's KV cache: sized by what the rollout needs, estimated exactly, and refused with one
line (before anything is allocated or written) when it cannot fit in memory."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sequence import Sequence
from srtcli.errors import SrtError
from srtcli.rollout.engine.kv_memory import available_bytes, check_kv_fits, kv_cache_bytes
from srtcli.rollout.embedded import engine_slots
from srtcli.rollout.engine.sampling import SamplingParams
from tests.srtcli.rollout.engine.support import arch_model

torch.set_num_threads(1)


@pytest.mark.parametrize("name", ["llama", "gpt2", "opt", "gpt_neox", "phi", "gemma", "qwen3"])
def test_the_estimate_is_the_bytes_the_engine_allocates(name):
    model = arch_model(name)
    eng = Engine(model, SamplingParams(temperature=0), make_drafter("none"), slots=3, budget=0, max_len=40)
    for p in ([1, 2, 3], [4, 5], [6]):
        eng.admit(Sequence(p, max_new_tokens=2))
    eng.step()
    allocated = sum(t.nbytes for d in (eng.kv_cache.k, eng.kv_cache.v) for t in d.values())
    assert allocated == kv_cache_bytes(model, 3, 40) > 0


def test_a_cache_that_cannot_fit_is_refused_before_anything_is_allocated():
    model = arch_model("llama")
    need = kv_cache_bytes(model, 8, 100)
    check_kv_fits(model, 8, 100, available=need)
    with pytest.raises(SrtError, match=r"KV cache for 8 sequences of up to 100 tokens needs .* lower --batch-size"):
        check_kv_fits(model, 8, 100, available=need - 1)
    assert available_bytes(torch.device("cpu")) > 0
    with pytest.raises(SrtError, match="KV cache for 10000000000 sequences"):  # petabytes: never fits
        Engine(model, SamplingParams(temperature=0), make_drafter("none"), slots=10**10, budget=0, max_len=1000)


def test_slots_are_capped_at_the_samples_of_a_rollout_batch_plus_run_ahead():
    assert engine_slots(100_000, per=4, todo=4, n_prompts=4, k=2, run_ahead=False) == 8
    assert engine_slots(100_000, per=4, todo=4, n_prompts=4, k=2, run_ahead=True) == 12
    assert engine_slots(100_000, per=2, todo=4, n_prompts=4, k=2, run_ahead=True) == 6
    assert engine_slots(5, per=4, todo=4, n_prompts=4, k=2, run_ahead=True) == 5  # --batch-size still bounds
    assert engine_slots(32, per=1, todo=0, n_prompts=4, k=2, run_ahead=False) == 1  # a resumed, finished pool


def prompts_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(4)))
    return f


def test_a_huge_batch_size_on_a_few_prompts_just_runs(tmp_path):
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts_file(tmp_path)), "-n", "2", "--batch-size", "1000000",
                                 "--max-new-tokens", "8", "--out", str(tmp_path / "pool"), "--cache", str(tmp_path / "c"),
                                 "--json"])
    assert r.exit_code == 0, r.output
    steps = [json.loads(x) for x in (tmp_path / "pool" / "rollout.jsonl").read_text().splitlines()]
    assert len({s["trajectory_id"] for s in steps}) == 8


def test_a_rollout_whose_cache_cannot_fit_writes_nothing(tmp_path):
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts_file(tmp_path)), "-n", "100000000",
                                 "--batch-size", "1000000000", "--out", str(tmp_path / "pool"),
                                 "--cache", str(tmp_path / "c")])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "KV cache for 400000000 sequences" in lines[0] and "available on cpu" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]
