"""Packing a steps pool into prefix-tree shards (what `srt pack` does).

The pool's steps, validated, get their GRPO advantages and are grouped by `prompt_uid`; each
group's prefix tree is built and the trees are bin-packed into rows (attention.rows); the rows
and their steps are written as one shard set, atomically (srtcli.shards). The output directory
is checked before the pool is read, so a wrong `--out` costs no work and loses nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attention.rows import pack_rows
from srtcli.advantages import grpo_advantages
from srtcli.errors import Interrupted, SrtError
from srtcli.pool import StepRecord, read_pool
from srtcli.progress import progress
from srtcli.shards import ShardRow, check_out, write_shards


def drop_too_long(steps: list[StepRecord], max_tokens: int, skip_bad: bool, pool: Path) -> tuple[list[StepRecord], int]:
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


def _summary(flat: list[StepRecord], groups: int, rows: list, max_tokens: int, pad_to: int) -> dict[str, Any]:
    original = sum(len(s.input_ids) for s in flat)
    packed = sum(r.n_real for r in rows)
    return {
        "sequences": len(flat),
        "groups": groups,
        "original_tokens": original,
        "packed_tokens": packed,
        "padded_tokens": sum(len(r) for r in rows),
        "token_ratio": round(packed / original, 6),
        "rows": len(rows),
        "max_tokens": max_tokens,
        "pad_to": pad_to,
    }


def build_rows(steps: list[StepRecord], max_tokens: int, pad_to: int,
               as_json: bool = False) -> tuple[list[ShardRow], dict[str, Any]]:
    """Fill in advantages, group, pack and pair rows with their steps: (ShardRows, summary)."""
    for s, adv in zip(steps, grpo_advantages(steps)):
        s.advantage = adv
    groups: dict[str, list[StepRecord]] = {}
    for s in steps:
        groups.setdefault(s.prompt_uid, []).append(s)
    flat = [s for g in groups.values() for s in g]
    with progress("packing groups", total=len(groups), as_json=as_json) as bar:
        rows = pack_rows([[s.input_ids for s in g] for g in groups.values()], max_tokens, pad_to,
                         on_group=bar.advance)
    shard_rows = [ShardRow(r, [flat[i] for i in r.seq_ids]) for r in rows]
    return shard_rows, _summary(flat, len(groups), rows, max_tokens, pad_to)


def pack_pool(steps: Path, out: Path, max_tokens: int = 8192, pad_to: int = 128, rows_per_shard: int = 64,
              skip_bad: bool = False, overwrite: bool = False, as_json: bool = False) -> dict[str, Any]:
    """Pack the pool `steps` into a shard set at `out`; returns the summary (the manifest's
    figures, `skipped` lines and too-long steps, and `shards`)."""
    target = check_out(out, overwrite, inputs=[steps])
    stats: dict[str, int] = {}
    try:
        records = read_pool(steps, skip_bad=skip_bad, stats=stats)
        records, too_long = drop_too_long(records, max_tokens, skip_bad, steps)
        shard_rows, summary = build_rows(records, max_tokens, pad_to, as_json)
        summary["skipped"] = stats.get("skipped", 0) + too_long
        manifest = write_shards(target, shard_rows, summary, rows_per_shard=rows_per_shard)
    except KeyboardInterrupt:  # write_shards swaps a complete set into place, or leaves `out` as it was
        raise Interrupted("srt pack: interrupted; a shard set is written whole or not at all, "
                          "so rerun the same command") from None
    summary["shards"] = len(manifest["shards"])
    return summary
