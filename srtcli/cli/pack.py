"""`srt pack`: a steps pool -> prefix-tree packed shards (the work is srtcli.pack.pack_pool).

Prints sequences, original and packed tokens, the token ratio, rows and shards, or with
`--json` the summary as one JSON object.
"""

from __future__ import annotations

import json as jsonlib
from pathlib import Path

import click

from srtcli.cli.config import config_option


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
    from srtcli.pack import pack_pool

    summary = pack_pool(steps, out, max_tokens, pad_to, rows_per_shard, skip_bad, overwrite, as_json=json)
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
