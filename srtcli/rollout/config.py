"""What one `srt rollout` run is asked to do: its options, typed, and the rules derived from them.

Field names are the command's parameter names (`-n` is `k`, `--prompts` is `prompts_path`,
`--cache` is `cache_opt`), and each default here is the command's default: the command line
takes its defaults from this class, so a library caller and the command agree without repeating
them. Rules that need more than one option, or the device, are methods (`tool`, `pool_file`,
`proposer_adaptive`, `tail_trees`, `run_ahead_on`, `batch_prompts`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cache_store.store import LOAD_TOKENS

TREE_ATTENTION = ("sdpa", "eager")  # the attentions that verify a draft tree (srt_slots' mask)
TAIL_NODES = 64  # a tail tree's nodes at most (the engine's `tail_nodes`)


def adaptive_default(device_type: str) -> bool:
    """Where srt does not time the forwards itself (the vLLM proposer), adaptive draft lengths
    unless on CUDA: on a CPU verified tokens cost FLOPs and adapting paid for itself; with CUDA
    they are nearly free and a fixed budget takes fewer forwards (docs/benchmarks.md)."""
    return device_type != "cuda"


@dataclass(frozen=True)
class RolloutConfig:
    """The options of a rollout (see `srt rollout --help` for each)."""

    prompts_path: str
    model: str | None = None  # None: the bundled model
    k: int = 8  # samples per prompt
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    draft: str = "srt"
    budget: int = 8
    min_prob: float = 0.1
    draft_mode: str = "sample"
    shared_tree: bool = True
    draft_stop: bool = True
    load_tokens: int = LOAD_TOKENS  # tokens of a prompt's stored rollouts its tree is built from
    draft_length: str = "cost"  # cost | adaptive | fixed (srtcli.rollout.drafters.draft_length)
    tail_nodes: int | None = None  # None: by device and attention (`tail_trees`)
    cache_opt: str | None = None  # None: $SRT_CACHE or ~/.cache/srt
    out: str = "pool"
    batch_size: int = 32
    rollout_batch: int = 0  # 0: the whole file
    admission: str = "sample"  # the order a rollout batch's samples start in (plan.admission_order)
    run_ahead: bool | None = None  # None: by device (`run_ahead_on`)
    run_ahead_tokens: int = 32
    tools: str | None = None  # None: by model (`tool`)
    max_turns: int = 8
    max_tool_tokens: int = 256
    max_context: int = 0  # 0: the model's context
    tool_timeout: float = 30.0
    tool_workers: int = 32
    reward: str | None = None
    device: str = "auto"
    threads: int = 1
    resume: bool = False
    engine: str = "embedded"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # None: by platform (the vLLM engine)

    @property
    def tool(self) -> str:
        """--tools, resolved: the bundled model calls the calculator, other models nothing."""
        return self.tools or ("none" if self.model else "calculator")

    @property
    def pool_file(self) -> Path:
        """`--out` itself if it ends in .jsonl, else `<out>/rollout.jsonl`."""
        return pool_file(self.out)

    @property
    def reward_spec(self) -> str | None:
        """--reward, with an empty value meaning the default."""
        return self.reward or None

    @property
    def uses_cache(self) -> bool:
        """Whether the run drafts from (and writes to) the tree cache."""
        return self.draft == "srt"

    def proposer_adaptive(self, device_type: str) -> bool:
        """Whether the vLLM proposer adapts draft lengths: --draft-length adaptive, or `cost`
        there, which it leaves to `adaptive_default` (vLLM's forwards are not srt's to time)."""
        if self.draft_length == "cost":
            return adaptive_default(device_type)
        return self.draft_length == "adaptive"

    def tail_trees(self, device_type: str, attn: str) -> int:
        """--tail-nodes unless set: TAIL_NODES with CUDA where the model's attention can verify a
        tree (sdpa, eager), else 0. A tail tree turns the long tail's cheap small forwards into
        full ones with fewer of them: a gain where a forward costs about the same whatever its
        tokens (a GPU), a loss on a CPU (docs/benchmarks.md, "What each of srt's parts is
        worth")."""
        if self.tail_nodes is not None:
            return self.tail_nodes
        return TAIL_NODES if device_type == "cuda" and attn in TREE_ATTENTION else 0

    def run_ahead_on(self, device_type: str) -> bool:
        """--run-ahead unless set: on with CUDA; off on CPU, where its extra rows slow the real work."""
        if self.run_ahead is not None:
            return bool(self.run_ahead)
        return device_type == "cuda"

    def batch_prompts(self, todo: int) -> int:
        """Prompts per rollout batch: --rollout-batch, 0 meaning every prompt still to do."""
        return self.rollout_batch or max(1, todo)


def pool_file(out: str | Path) -> Path:
    """The pool file that `--out` names."""
    p = Path(out)
    return p if p.name.endswith(".jsonl") else p / "rollout.jsonl"


def default(name: str) -> Any:
    """The default of one option, for the command line."""
    return next(f.default for f in fields(RolloutConfig) if f.name == name)
