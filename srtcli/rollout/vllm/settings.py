"""The SRT proposer's settings in vLLM's worker: the cache, the length cap, eos, draft options.

A server (`vllm serve`, `vllm.LLM`, an RL framework's vLLM) passes none: the proposer then uses
`ProposerSettings(cache=$SRT_CACHE or ~/.cache/srt)` and fills in the rest from the model (`worker_facts`).
`srt rollout --engine vllm` writes one as JSON and tells the worker to read it
(`srt_reload(path)` before a rollout), or names one in `$SRT_VLLM_SETTINGS` at start-up; it lists
no prompts: every user of the proposer goes through the same first-seen prompt rule
(`tree_drafts`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cache_store.store import LOAD_TOKENS
from srtcli.rollout.drafters.prompt_trees import LOAD_STEPS

SETTINGS_ENV = "SRT_VLLM_SETTINGS"


@dataclass
class ProposerSettings:
    """What the worker drafts with; None fields are filled in from the model and platform."""

    cache: str | None = None  # None: draft from in-memory trees only
    max_new_tokens: int | None = None  # None: no cap of srt's (vLLM's own max_tokens ends requests)
    eos_ids: list[int] | None = None  # None: the tokenizer's and generation config's eos
    min_prob: float = 0.1
    adaptive: bool | None = None  # the embedded engine's adaptive draft length; None: on unless CUDA
    shared: bool = True  # also draft from a run-wide tree (--shared-tree)
    load_tokens: int = LOAD_TOKENS  # a prompt's tree is built from its newest stored tokens (--load-tokens)
    load_steps: int = LOAD_STEPS  # a prompt's tree is built off the step and used this many steps later (0: in it)
    fingerprint: str | None = None  # the tokenizer's (srtcli.tokenizers); None: computed in the worker
    threads: int | None = None  # threads of a step's tree appends and drafts; None: the worker's cores, at most 4

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def write_settings(path: Path, settings: ProposerSettings) -> None:
    """Write the settings for the worker to read (`srt_reload`, or `$SRT_VLLM_SETTINGS` at start-up)."""
    path.write_text(settings.to_json())


def read_settings(path: str | Path) -> ProposerSettings:
    return ProposerSettings(**json.loads(Path(path).read_text()))
