"""The SRT drafter as a vLLM speculative proposer (`method="custom_class"`), run in vLLM's worker.

vLLM (0.32) builds `SrtProposer(vllm_config)` inside its worker process and, after every step,
calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`; the
drafting itself is `tree_drafts.TreeDrafts`, which fills the cache exactly as the embedded
`srt` drafter does.

The rollout driver talks to the worker through vLLM's `collective_rpc` and
`SrtWorkerExtension` (mixed into the worker, so no code is pickled): `srt_reload(path)` before
a rollout reads the prompt table (`table.Table`: prompts, cache path, K, limits;
`$SRT_VLLM_TABLE` names one at start-up instead), and `srt_finish` after each `generate` ends
every sequence, appends the new sequences to the store, and returns this worker's counters.
With tensor parallelism every rank drafts the same way but only rank 0 writes LMDB, so each
rollout is stored once.

The two classes' dotted paths, `srtcli.rollout.vllm.proposer.SrtProposer` and
`srtcli.rollout.vllm.proposer.SrtWorkerExtension`, are what users pass to vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from srtcli.rollout.vllm.table import TABLE_ENV, Table, read_table
from srtcli.rollout.vllm.tree_drafts import TreeDrafts


class SrtProposer:
    """vLLM's custom proposer: `speculative_config={"method": "custom_class",
    "model": "srtcli.rollout.vllm.proposer.SrtProposer", "num_speculative_tokens": B}`."""

    def __init__(self, vllm_config: Any):
        self.budget = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.drafts = TreeDrafts(Table(None, {}, 1, 1, []), self.budget, self.max_model_len)
        if os.environ.get(TABLE_ENV):
            self.reload(os.environ[TABLE_ENV])

    def reload(self, path: str) -> None:
        """Start a rollout: read its table (prompts, cache); pending sequences are appended first."""
        self.drafts.finish()
        if self.drafts.trees.store is not None:
            self.drafts.trees.store.close()
        table = read_table(path)
        store = None
        if table.cache is not None:
            from cache_store.seqstore import LmdbSequenceStore

            store = LmdbSequenceStore.open(Path(table.cache))
        self.drafts = TreeDrafts(table, self.budget, self.max_model_len, store, writer=_is_rank0())

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The CPU runner calls this on drafters; a tree needs no model."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        return self.drafts.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)


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

    def srt_reload(self, path: str) -> bool:
        p = self._srt()
        if p is not None:
            p.reload(path)
        return p is not None

    def srt_finish(self) -> dict[str, int]:
        p = self._srt()
        return p.drafts.finish() if p is not None else {}
