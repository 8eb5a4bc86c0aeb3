"""The prompt table the rollout driver writes for the SRT proposer in vLLM's worker: the cache,
the prompts srt submitted, and the draft settings. The worker reads it when the driver calls
`srt_reload(path)` before a rollout, or at start-up from the file `$SRT_VLLM_TABLE` names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TABLE_ENV = "SRT_VLLM_TABLE"


@dataclass
class Table:
    """What the worker needs: the cache, the prompts srt submitted, and the draft settings."""

    cache: str | None  # None: draft from in-memory trees only
    prompts: dict[str, list[int]]  # uid -> prompt ids
    k: int  # samples per prompt (a group is done when all K are)
    max_new_tokens: int
    eos_ids: list[int]
    min_prob: float = 0.1
    adaptive: bool = True  # the embedded engine's adaptive draft length (--adaptive-budget)
    shared: bool = True  # also draft from a run-wide tree (--shared-tree)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def write_table(path: Path, table: Table) -> None:
    """Write the table for the worker to read (`srt_reload`, or `$SRT_VLLM_TABLE` at start-up)."""
    path.write_text(table.to_json())


def read_table(path: str | Path) -> Table:
    return Table(**json.loads(Path(path).read_text()))
