"""`srt pack`: a steps pool -> prefix-tree packed shards.

Reads and validates the pool (srtcli/pool.py), fills in GRPO advantages per group, groups steps
by `prompt_uid`, builds each group's prefix tree and bin-packs the trees into rows
(attention/rows.py), and writes the rows with their steps as a shard set (srtcli/shards.py),
atomically. Prints sequences, original and packed tokens, the token ratio, rows and shards.
"""

from __future__ import annotations

import json as jsonlib
import sys
from pathlib import Path
from typing import Any

import click

from srtcli.cli.config import config_option
from srtcli.errors import Interrupted, SrtError
from srtcli.pool import StepRecord, grpo_advantages, read_pool


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), disable=not sys.stdout.isatty()
    )


def _drop_too_long(steps: list[StepRecord], max_tokens: int, skip_bad: bool, pool: Path) -> tuple[list[StepRecord], int]:
    """A step longer than a row is a user error naming it (or counted and skipped)."""
    kept, skipped = [], 0
    for s in steps:
        if len(s.input_ids) <= max_tokens:
            kept.append(s)
            continue
        if not skip_bad:
            raise SrtError(
                f"{pool}: step (prompt_uid={s.prompt_uid!r}, trajectory_id={s.trajectory_id!r}, step={s.step}) "
                f"has {len(s.input_ids)} tokens, more than --max-tokens {max_tokens}"
            )
        skipped += 1
    if not kept:
        raise SrtError(f"{pool}: no step fits --max-tokens {max_tokens}")
    return kept, skipped


def build_rows(steps: list[StepRecord], max_tokens: int, pad_to: int, progress=None) -> tuple[list, dict[str, Any]]:
    """Group, pack and pair rows with their steps; returns (ShardRows, summary)."""
    from attention.rows import pack_rows
    from srtcli.shards import ShardRow

    for s, adv in zip(steps, grpo_advantages(steps)):
        s.advantage = adv
    groups: dict[str, list[StepRecord]] = {}
    for s in steps:
        groups.setdefault(s.prompt_uid, []).append(s)
    flat = [s for g in groups.values() for s in g]
    task = progress.add_task("packing groups", total=len(groups)) if progress else None
    tick = (lambda: progress.advance(task)) if progress else None
    rows = pack_rows([[s.input_ids for s in g] for g in groups.values()], max_tokens, pad_to, on_group=tick)
    shard_rows = [ShardRow(r, [flat[i] for i in r.seq_ids]) for r in rows]
    original = sum(len(s.input_ids) for s in flat)
    packed = sum(r.n_real for r in rows)
    summary = {
        "sequences": len(flat),
        "groups": len(groups),
        "original_tokens": original,
        "packed_tokens": packed,
        "padded_tokens": sum(len(r) for r in rows),
        "token_ratio": round(packed / original, 6),
        "rows": len(rows),
        "max_tokens": max_tokens,
        "pad_to": pad_to,
    }
    return shard_rows, summary


@click.command()
@config_option
@click.option("--steps", required=True, type=click.Path(path_type=Path), help="Steps pool directory (or file).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Shards directory to create.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=8192, show_default=True, help="Real tokens per row.")
@click.option("--pad-to", type=click.IntRange(min=1), default=128, show_default=True, help="Pad rows to a multiple of this.")
@click.option("--rows-per-shard", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--skip-bad", is_flag=True, help="Count and skip bad lines (and too-long steps) instead of failing.")
@click.option("--overwrite", is_flag=True, help="Replace an existing shards directory (only once the new one is complete).")
@click.option("--json", is_flag=True, help="Print the summary as one JSON object.")
def pack(steps: Path, out: Path, max_tokens: int, pad_to: int, rows_per_shard: int,
         skip_bad: bool, overwrite: bool, json: bool) -> None:
    """Pack a steps pool into prefix-tree rows and write shards."""
    from srtcli.shards import check_out, write_shards

    check_out(out, overwrite, inputs=[steps])
    stats: dict[str, int] = {}
    try:
        records = read_pool(steps, skip_bad=skip_bad, stats=stats)
        records, too_long = _drop_too_long(records, max_tokens, skip_bad, steps)
        with _progress() as progress:
            shard_rows, summary = build_rows(records, max_tokens, pad_to, progress)
            summary["skipped"] = stats.get("skipped", 0) + too_long
            manifest = write_shards(out, shard_rows, summary, rows_per_shard=rows_per_shard, overwrite=overwrite)
    except KeyboardInterrupt:  # write_shards swaps a complete set into place, or leaves `out` as it was
        raise Interrupted("srt pack: interrupted; a shard set is written whole or not at all, "
                          "so rerun the same command") from None
    summary["shards"] = len(manifest["shards"])
    if json:  # the parameter is named after the flag, so `--config` can set it
        click.echo(jsonlib.dumps({**summary, "out": str(out)}))
        return
    click.echo(
        f"{summary['sequences']} sequences in {summary['groups']} groups: "
        f"{summary['original_tokens']} tokens -> {summary['packed_tokens']} packed "
        f"(token ratio {summary['token_ratio']:.4f}), {summary['rows']} rows, {summary['shards']} shards -> {out}"
    )
    if summary["skipped"]:
        click.echo(f"skipped {summary['skipped']} bad line(s)/step(s)")
