"""The SRT drafter as a vLLM speculative proposer (`method="custom_class"`), run in vLLM's worker.

One configuration for any vLLM user (`vllm serve`, `vllm.LLM`, an RL framework's engine):

    speculative_config={"method": "custom_class",
                        "model": "srtcli.rollout.vllm.proposer.SrtProposer",
                        "num_speculative_tokens": 8}

(from Python, `speculative_config(8)` returns it after checking the installed vLLM's version)
with `$SRT_CACHE` naming the cache (default `~/.cache/srt`, as for every srt command). vLLM
(0.22.0 to 0.33.x: `versions`) builds `SrtProposer(vllm_config)` inside its worker process and, after every step, calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`; the drafting is
`tree_drafts.TreeDrafts`: a request's prompt is what its row held when first seen, rows with
one prompt share one tree of its tree session, loaded from the cache and committed back as
sequences end (`commits`). The tokenizer's fingerprint, eos ids and draft defaults come from vLLM's config
(`worker_facts`), so prompt uids are the ones `srt rollout` and `srt cache add` write.
What is waiting is appended when vLLM has been idle for a while (a thread here) and when the
process exits normally (a multiprocessing finalizer; `vllm serve` lets its processes exit only
with `--shutdown-timeout` > 0, else it kills them: then what was committed stays).

`srt rollout --engine vllm` is one user of this path: it also mixes `SrtWorkerExtension` into
the worker (`worker_extension_cls`), so no cache is opened at start-up; it calls
`collective_rpc("srt_reload", path)` before a rollout (its `settings.ProposerSettings`: the cache, the length
cap, draft options; `$SRT_VLLM_SETTINGS` names one at start-up instead), and `srt_finish` after
each `generate`, which ends every sequence and the session's batch (append, then tick) and
returns the counters. With tensor parallelism every rank drafts the same way but only rank 0
writes to the cache.
"""

from __future__ import annotations

import multiprocessing.util
import os
import threading
import time
import weakref
from typing import Any

import numpy as np

from srtcli.rollout.vllm.commits import commit_settings, open_link
from srtcli.rollout.vllm.settings import SETTINGS_ENV, ProposerSettings, read_settings
from srtcli.rollout.vllm.tree_drafts import TreeDrafts
from srtcli.rollout.vllm.versions import require_supported
from srtcli.rollout.vllm.worker_facts import completed, model_facts

PROPOSER = "srtcli.rollout.vllm.proposer.SrtProposer"


def speculative_config(num_speculative_tokens: int) -> dict:
    """vLLM's `speculative_config` for the SRT proposer; SrtError (one line) when the installed
    vLLM is outside the supported range."""
    require_supported()
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_speculative_tokens}


class SrtProposer:
    """vLLM's custom proposer: `speculative_config={"method": "custom_class",
    "model": "srtcli.rollout.vllm.proposer.SrtProposer", "num_speculative_tokens": B}`."""

    def __init__(self, vllm_config: Any):
        require_supported()  # vLLM reports its one line as the reason the proposer could not be built
        self.budget = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.max_num_seqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.facts = model_facts(vllm_config)
        self.request_ids: Any = None  # set by `SrtWorkerExtension`: the batch's request ids in row order
        self.commit_every, self.commit_seconds = commit_settings()
        self.drafts = self._drafts(ProposerSettings(), None)
        if os.environ.get(SETTINGS_ENV):
            self.reload(os.environ[SETTINGS_ENV])
        elif not _driven(vllm_config):
            from srtcli.store_link import cache_location

            self.start(ProposerSettings(cache=str(cache_location(None))))
        _idle_commits(self, self.commit_seconds)
        multiprocessing.util.Finalize(self, self.close, exitpriority=10)

    def _drafts(self, settings: ProposerSettings, link: Any) -> TreeDrafts:
        return TreeDrafts(completed(settings, self.facts), self.budget, self.max_model_len, link,
                          commit_every=self.commit_every, commit_seconds=self.commit_seconds,
                          max_num_seqs=self.max_num_seqs, request_ids=self.request_ids)

    def start(self, settings: ProposerSettings) -> None:
        """Draft with these settings from now on; what is pending is appended first."""
        self.close()
        self.drafts = self._drafts(settings, open_link(settings.cache, writer=_is_rank0()))

    def reload(self, path: str) -> str:
        """Start a rollout with the settings at `path`; the tokenizer fingerprint drafts run under."""
        self.start(read_settings(path))
        return str(self.drafts.settings.fingerprint)

    def close(self) -> None:
        """End every sequence, append, close the session (drafting goes on without a store)."""
        self.drafts.finish()
        self.drafts.session.close()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The CPU runner calls this on drafters; a tree needs no model."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        return self.drafts.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)


def _idle_commits(proposer: SrtProposer, seconds: float) -> None:
    """A daemon thread that looks every `seconds` / 2 whether vLLM is idle, to append what waits."""
    ref = weakref.ref(proposer)

    def loop() -> None:
        while (p := ref()) is not None:
            p.drafts.commit_if_idle()
            del p
            time.sleep(max(seconds / 2, 0.05))

    threading.Thread(target=loop, name="srt-idle-commits", daemon=True).start()


def _driven(vllm_config: Any) -> bool:
    """Whether srt's own driver runs this engine (it mixes in `SrtWorkerExtension` and calls
    `srt_reload` before drafting), so nothing is opened at start-up."""
    ext = getattr(vllm_config.parallel_config, "worker_extension_cls", "") or ""
    return ext == f"{SrtWorkerExtension.__module__}.{SrtWorkerExtension.__qualname__}"


def _is_rank0() -> bool:
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return get_tp_group().rank_in_group == 0 and get_pp_group().rank_in_group == 0
    except Exception:  # not initialised (a single process): this is the only writer
        return True


class SrtWorkerExtension:
    """Mixed into vLLM's worker (`LLM(worker_extension_cls=...)`), so the driver can call
    `llm.collective_rpc("srt_finish")` without pickling code into the worker."""

    def _srt(self) -> "SrtProposer | None":
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        return drafter if isinstance(drafter, SrtProposer) else None

    def srt_reload(self, path: str) -> str:
        """Read the driver's settings; the tokenizer fingerprint ("" without the SRT proposer)."""
        p = self._srt()
        if p is None:
            return ""
        runner = self.model_runner
        p.request_ids = lambda: runner.input_batch.req_ids  # a driver's turns are named (row_tracking)
        return p.reload(path)

    def srt_finish(self, ends: list | None = None) -> dict[str, int]:
        """A rollout batch is over: every sequence ends (completed from `ends`, each request's
        (prompt uid, length, last tokens) as the driver got it: `TreeDrafts.complete`), what they
        wrote is appended, the clock advances; the batch's counters."""
        p = self._srt()
        if p is None:
            return {}
        counters = p.drafts.finish(ends)
        p.drafts.session.end_batch()
        return counters
