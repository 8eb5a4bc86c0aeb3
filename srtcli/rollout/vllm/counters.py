"""What a vLLM rollout counted: vLLM's own speculative-decoding metrics and the SRT proposer's
counters (returned by the worker after each batch), as the shared summary's `Counts` plus the
vLLM-only summary keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from srtcli.rollout.summary import Counts


@dataclass
class Counters:
    """The SRT proposer's own counts in the worker (`TreeDrafts.c`), returned by `srt_finish`."""

    steps: int = 0  # propose calls (one per engine step)
    row_forwards: int = 0  # rows that sampled tokens in a step (the embedded engine's row forwards)
    rows: int = 0  # rows that could be drafted for
    drafted_rows: int = 0  # rows given a non-empty draft
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens the row then kept (srt's own count)
    groups: int = 0  # groups loaded (filled in from the trees by `finish`)
    hits: int = 0
    resumed_rows: int = 0  # sequences that left the batch and came back as themselves
    commits: int = 0  # appends to the store
    idle_commits: int = 0  # commits when vLLM looked idle (a stalled step looks the same)

    def drafted(self, rows: int, lengths: np.ndarray) -> None:
        """A step drafted for `rows` rows; `lengths` holds every row's draft length (0 for the others)."""
        self.rows += rows
        self.drafted_rows += int(np.count_nonzero(lengths))
        self.drafted_tokens += int(lengths.sum())

    def take(self) -> dict[str, int]:
        """The counts so far, and start again from zero (the object stays: the tracker counts into it too)."""
        out = dict(self.__dict__)
        self.__init__()
        return out


def spec_metrics(llm: Any) -> dict[str, float]:
    """vLLM's own cumulative speculative-decoding counters (`vllm:spec_decode_*`)."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode_num"):
            continue
        key = m.name[len("vllm:spec_decode_"):]
        if hasattr(m, "values"):  # per position (a Vector)
            for pos, v in enumerate(m.values):
                out[f"{key}_{pos}"] = out.get(f"{key}_{pos}", 0) + v
        else:
            out[key] = out.get(key, 0) + m.value
    return out


def add_counters(acc: dict, d: dict) -> None:
    """Add one batch's proposer counters to the run's."""
    for key, v in d.items():
        acc[key] = acc.get(key, 0) + v


def vllm_counts(generated: int, srt: dict, vm: dict, budget: int) -> tuple[Counts, dict[str, Any]]:
    """The run's counts from the proposer's counters `srt` and vLLM's metrics `vm` (this run's
    share), and the vLLM-only summary keys."""
    drafts, dtoks, acc = vm.get("num_drafts", 0), vm.get("num_draft_tokens", 0), vm.get("num_accepted_tokens", 0)
    if not drafts and srt.get("drafted_tokens"):
        # vLLM's counters live in one process-wide Prometheus registry that the most recently
        # built LLM owns; for an older engine they read 0, so srt's own counts stand in
        dtoks, acc = srt["drafted_tokens"], srt.get("accepted_tokens", 0)
    rows = srt.get("row_forwards", 0)
    if not rows and not srt:
        # no srt counters (ngram or no drafts): every row step yields one token beyond its kept
        # drafts, so row steps ~= generated - accepted (drafts kept past the cap make it approximate)
        rows = generated - acc if generated > acc else 0
    hit_rate = srt["hits"] / srt["groups"] if srt.get("groups") else None
    counts = Counts(generated, srt.get("steps"), rows, dtoks, acc, 0, hit_rate)
    return counts, {
        "engine": "vllm",
        "vllm_num_drafts": int(drafts),
        "vllm_mean_acceptance_length": round(1 + acc / drafts, 4) if drafts else None,
        "vllm_accepted_per_pos": [int(vm[f"num_accepted_tokens_per_pos_{i}"]) for i in range(budget)
                                  if f"num_accepted_tokens_per_pos_{i}" in vm],
        "srt_drafted_tokens": srt.get("drafted_tokens", 0),
        "srt_accepted_tokens": srt.get("accepted_tokens", 0),
        "srt_drafted_rows": srt.get("drafted_rows", 0),
        "srt_resumed_rows": srt.get("resumed_rows", 0),
        "srt_commits": srt.get("commits", 0),
        "srt_idle_commits": srt.get("idle_commits", 0),
    }
