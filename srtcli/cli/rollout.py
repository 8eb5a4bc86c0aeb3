"""`srt rollout`: speculative rollout of a prompts file into a steps pool.

The command line only: the options (defaults from srtcli.rollout.config.RolloutConfig), the
pool's guard (srtcli.rollout.pool_guard: one writer, a resume continues the same run), the
engine's backend, the driver (srtcli.rollout.driver `run_rollout`), and the summary, as a
table or one JSON object. Ctrl-C says what the pool keeps and how to go on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from srtcli.cli.config import config_option
from srtcli.errors import Interrupted
from srtcli.rollout.config import RolloutConfig, default
from srtcli.rollout.drafters import DRAFTERS
from srtcli.rollout.drafters.draft_length import DRAFT_LENGTHS


@click.command()
@config_option
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False), help="Prompts JSONL.")
@click.option("--model", default=default("model"), help="A local HF causal LM directory (default: the bundled model).")
@click.option("-n", "--n", "k", type=click.IntRange(min=1), default=default("k"), show_default=True,
              help="Samples per prompt.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=default("max_new_tokens"), show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=default("temperature"), show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=default("top_p"),
              show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=default("top_k"), show_default=True, help="0 = off.")
@click.option("--seed", type=int, default=default("seed"), show_default=True)
@click.option("--draft", type=click.Choice(DRAFTERS), default=default("draft"), show_default=True)
@click.option("--budget", type=click.IntRange(min=0), default=default("budget"), show_default=True,
              help="Max draft tokens per step.")
@click.option("--min-prob", type=click.FloatRange(0.0, 1.0), default=default("min_prob"), show_default=True,
              help="srt: stop a draft when its path probability falls below this.")
@click.option("--draft-mode", type=click.Choice(["greedy", "sample", "tree"]), default=default("draft_mode"),
              show_default=True,
              help="srt: follow the most frequent child (point mass), sample children (ratio rule), or "
                   "verify a tree of --budget candidate nodes (embedded engine; docs/rollout.md).")
@click.option("--shared-tree/--no-shared-tree", default=default("shared_tree"), show_default=True,
              help="srt: also draft from one run-wide tree over every prompt's outputs "
                   "when it predicts more than the prompt's own tree (docs/rollout.md).")
@click.option("--draft-stop/--no-draft-stop", default=default("draft_stop"), show_default=True,
              help="srt sample mode: draw children by the probability the policy gave them when "
                   "they were stored, and let the mass left over end the draft (exact; fewer "
                   "rejected tokens verified; docs/rollout.md).")
@click.option("--load-tokens", type=click.IntRange(min=1), default=default("load_tokens"), show_default=True,
              help="srt: build a prompt's tree from its newest stored rollouts, up to this many tokens "
                   "(a load pauses the step that first needs the prompt, ~1 us per token; docs/cache.md).")
@click.option("--draft-length", type=click.Choice(DRAFT_LENGTHS), default=default("draft_length"),
              show_default=True,
              help="How many of --budget draft tokens a row verifies: `cost`, those expected to save time, "
                   "from the engine's own forward timings and the acceptance it gets (none when nothing "
                   "pays); `adaptive`, by what the row last accepted; `fixed`, all. Sampled outputs are "
                   "bit-reproducible from --seed only with adaptive or fixed (docs/rollout.md).")
@click.option("--tail-nodes", type=click.IntRange(min=0), default=default("tail_nodes"),
              help="Embedded engine: a step verifies at most what a full batch of chains would (and at "
                   "most 512 positions); when "
                   "fewer rows run (the long tail), each drafts a tree of its share of the free "
                   "positions, up to this many nodes; 0 = off [default: 64 with CUDA where the model's "
                   "attention is sdpa or eager, else 0: on a CPU it costs more than it saves] "
                   "(exact; docs/rollout.md).")
@click.option("--cache", "cache_opt", default=default("cache_opt"),
              help="Cache directory, or a server every machine shares: redis://[user:password@]host:port/db "
                   "(rediss:// for TLS; ?prefix=NAME) (default $SRT_CACHE or ~/.cache/srt).")
@click.option("--out", default=default("out"), show_default=True, help="Steps pool directory (or a .jsonl file).")
@click.option("--batch-size", type=click.IntRange(min=1), default=default("batch_size"), show_default=True,
              help="Sequences generated together (engine slots; capped at what the prompts need).")
@click.option("--rollout-batch", type=click.IntRange(min=0), default=default("rollout_batch"), show_default=True,
              help="Prompts per synchronous rollout batch (0 = the whole file).")
@click.option("--admission", type=click.Choice(["sample", "prompt"]), default=default("admission"),
              show_default=True,
              help="Order a rollout batch's samples start in: sample-major (one sample of every prompt, "
                   "then the next: later samples draft from finished ones) or prompt-major (a prompt's K "
                   "samples together: one prompt prefill each; for long prompts with short answers).")
@click.option("--run-ahead/--no-run-ahead", default=default("run_ahead"),
              help="Long-tail run-ahead [default: on with CUDA; off on CPU, where its extra rows "
                   "slow the real work (docs/benchmarks.md)].")
@click.option("--run-ahead-tokens", type=click.IntRange(min=1), default=default("run_ahead_tokens"),
              show_default=True)
@click.option("--tools", default=default("tools"),
              help="Tools the model may call: calculator, python (sandboxed), none, or MODULE:NAME / FILE.py:NAME "
              "(a function, a list of functions, or an environment class; docs/rollout.md) "
              "[default: calculator for the bundled model, else none].")
@click.option("--max-turns", type=click.IntRange(min=1), default=default("max_turns"), show_default=True,
              help="Model turns per trajectory (a tool call opens the next one).")
@click.option("--max-tool-tokens", type=click.IntRange(min=1), default=default("max_tool_tokens"),
              show_default=True, help="Tokens of one tool result the model sees (the rest is cut).")
@click.option("--max-context", type=click.IntRange(min=0), default=default("max_context"), show_default=True,
              help="Tokens per trajectory: prompt, turns and tool results (0 = the model's context).")
@click.option("--tool-timeout", type=click.FloatRange(min=0.0, min_open=True), default=default("tool_timeout"),
              show_default=True, help="Seconds one tool call may run before it returns an error result.")
@click.option("--tool-workers", type=click.IntRange(min=0), default=default("tool_workers"), show_default=True,
              help="Tool calls run at once, off the engine (0 = in the engine's thread: reproducible, slower).")
@click.option("--reward", default=default("reward"), help="exact_match (<answer> tags), math_answer (a worked "
              "solution's final number: after ####, in \\boxed{}, after 'answer is', else the last one) or "
              "MODULE:FN (default: exact_match when every prompt has an `answer`, else 0).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=default("device"), show_default=True)
@click.option("--threads", type=click.IntRange(min=0), default=default("threads"), show_default=True,
              help="CPU threads for torch (0 = torch's default).")
@click.option("--resume", is_flag=True, help="Continue a pool a killed run left behind.")
@click.option("--engine", type=click.Choice(["embedded", "vllm"]), default=default("engine"), show_default=True,
              help="Generate with srt's own engine, or through vLLM's offline LLM API with SRT drafts "
              "as a vLLM proposer (docs/vllm.md).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=default("tensor_parallel_size"),
              show_default=True, help="vllm: tensor-parallel ranks.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.0, 1.0, min_open=True),
              default=default("gpu_memory_utilization"),
              help="vllm: share of accelerator memory (of RAM on CPU) for the KV cache "
              "[default: 0.1 on CPU, 0.9 on GPU].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def rollout(as_json: bool, **opts: Any) -> None:
    """Speculative rollout: sample K completions per prompt into a steps pool (lossless)."""
    from srtcli.rollout.driver import run_rollout
    from srtcli.rollout.pool_guard import guard_for
    from srtcli.rollout.summary import canonical_keys

    config = RolloutConfig(**opts)
    backend = backend_for(config)  # the embedded engine's device is checked here, before any write
    try:
        with guard_for(config) as guard:  # one writer per pool, and a resume must not change the run
            if guard.note:
                click.echo(guard.note, err=True)
            summary = run_rollout(config, backend)
    except KeyboardInterrupt:
        raise interrupted(config.pool_file) from None
    summary = {**summary, **canonical_keys(summary, config)}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        print_summary(summary)


def backend_for(config: RolloutConfig) -> Any:
    """The backend of `--engine`."""
    if config.engine == "vllm":
        from srtcli.rollout.vllm.engine import VllmBackend

        return VllmBackend()
    from srtcli.rollout.embedded import EmbeddedBackend

    return EmbeddedBackend(config.device)


def interrupted(pool: Path) -> Interrupted:
    """Ctrl-C: what the pool keeps and how to go on (the writer has closed it by now)."""
    from srtcli.rollout.plan import whole_groups

    where = click.get_current_context().command_path
    groups = whole_groups(pool)
    if groups is None:
        return Interrupted(f"{where}: interrupted; nothing was written to {pool}")
    return Interrupted(f"{where}: interrupted; rerun with --resume to continue "
                       f"({pool} keeps {groups} complete group{'s' if groups != 1 else ''})")


def print_summary(summary: dict) -> None:
    """The summary as a table on stdout (`n/a` for a missing or non-finite value)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="srt rollout")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, val in summary.items():
        if isinstance(val, float) and not math.isfinite(val):
            val = "n/a"
        table.add_row(key, "n/a" if val is None else str(val))
    Console().print(table)
