"""`srt cache`: inspect, prune, export, import and warm the persistent tree cache.

    srt cache stats  [--cache DIR] [--json]
    srt cache prune  --max-bytes N | --max-trees N | --older-than 7d | --min-count X | --drop-corrupt
                     [--compact] [--dry-run] [--yes]
    srt cache export OUT        a compacted, portable copy
    srt cache import IN         add another cache's counts to this one
    srt cache add SOURCE        warm the cache from rollout JSONL or a steps pool

The cache is `--cache DIR`, else `$SRT_CACHE`, else `~/.cache/srt`. stats/prune/export/import
never import torch (only `add` may, to load a tokenizer). The store itself is in
cache_store/ and `add`'s two-pass pipeline in srtcli.cache_add; this module parses flags and
prints (`--json`: one JSON object, the last line of stdout, whose `cache` is the cache
directory and `out` what the command wrote, as in every srt command).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from srtcli.cli.config import config_option
from srtcli.cache import open_store
from srtcli.errors import SrtError


def emit(as_json: bool, obj: dict[str, Any], lines: list[str]) -> None:
    """Print the human lines, or the JSON object as the last line of stdout."""
    if as_json:
        click.echo(json.dumps(obj, separators=(",", ":")))
    else:
        for line in lines:
            click.echo(line)


cache_opt = click.option("--cache", type=click.Path(file_okay=True), default=None,
                         help="Cache directory (default: $SRT_CACHE, else ~/.cache/srt).")
json_opt = click.option("--json", is_flag=True, help="Print one JSON object.")


@click.group()
def cache() -> None:
    """The persistent per-prompt tree cache (LMDB)."""


@cache.command()
@config_option
@cache_opt
@click.option("--top", type=click.IntRange(0, 1000), default=5, show_default=True, help="Largest trees to list.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Check every record's checksum (reads all records); --no-verify reads only metadata.")
@json_opt
def stats(cache: str | None, top: int, verify: bool, json: bool) -> None:  # noqa: A002 - names are the flags
    """Trees, nodes, tokens, bytes, compression, corrupt records, access times."""
    from cache_store.report import stats_lines
    from cache_store.stats import cache_stats

    with open_store(cache, readonly=True) as store:
        st = cache_stats(store, top=top, verify=verify)
    emit(json, {"cache": st.path, **st.to_dict()}, stats_lines(st))  # `path`: the old name of `cache`


def _criteria(max_bytes, max_trees, older_than, min_count, drop_corrupt):  # noqa: ANN001, ANN202
    from cache_store.clock import parse_duration, parse_size
    from cache_store.prune import PruneCriteria

    try:
        crit = PruneCriteria(
            max_bytes=None if max_bytes is None else parse_size(max_bytes),
            max_trees=max_trees,
            older_than=None if older_than is None else parse_duration(older_than),
            min_count=min_count,
            drop_corrupt=drop_corrupt,
        )
    except ValueError as e:
        raise SrtError(str(e)) from None
    if min_count is not None and not (min_count >= 0):
        raise SrtError(f"--min-count must be >= 0, got {min_count}")
    return crit


@cache.command()
@config_option
@cache_opt
@click.option("--max-bytes", default=None, help="Evict least recently used trees down to N bytes (512M, 2G).")
@click.option("--max-trees", type=click.IntRange(min=0), default=None, help="Keep at most N trees (LRU).")
@click.option("--older-than", default=None, help="Drop trees not accessed for this long (30s, 10m, 12h, 7d).")
@click.option("--min-count", type=float, default=None, help="Drop nodes whose decayed count is below X.")
@click.option("--drop-corrupt", is_flag=True, help="Drop records that fail their checksum.")
@click.option("--compact", is_flag=True, help="Shrink the file afterwards (compact copy + atomic swap).")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_opt
def prune(cache, max_bytes, max_trees, older_than, min_count, drop_corrupt, compact, dry_run, yes,
          json) -> None:  # noqa: ANN001, A002 - parameter names are the flag names (--config keys)
    """Evict trees (LRU, age, corrupt) and trim rare nodes; optionally compact the file."""
    from cache_store.prune import apply_prune, plan_prune
    from cache_store.report import prune_lines

    crit = _criteria(max_bytes, max_trees, older_than, min_count, drop_corrupt)
    if not crit.any() and not compact:
        raise SrtError("nothing to do: give --max-bytes, --max-trees, --older-than, --min-count, "
                       "--drop-corrupt or --compact")
    as_json = json
    with open_store(cache) as store:
        plan = plan_prune(store, crit)
        out = {"cache": str(store.path), "dry_run": dry_run, **plan.to_dict()}
        if dry_run:
            emit(as_json, out, prune_lines(plan, dry_run=True))
            return
        if compact:  # refuse before pruning, not halfway through
            from cache_store.transfer import check_compactable

            check_compactable(store)
        _confirm(yes, f"Remove {len(plan.evicted())} of {plan.trees_before} trees from {store.path}"
                 f"{' and compact it' if compact else ''}?")
        if crit.any():
            apply_prune(store, crit, plan)
        lines = prune_lines(plan, dry_run=False)
        if compact:
            from cache_store.transfer import compact as do_compact

            before, after = do_compact(store)
            out.update(file_bytes_before=before, file_bytes_after=after)
            lines.append(f"compacted: {before:,} -> {after:,} bytes")
    emit(as_json, out, lines)


def _confirm(yes: bool, question: str) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise SrtError("refusing to modify the cache without --yes (stdin is not a terminal); "
                       "use --dry-run to see what would go")
    if not click.confirm(question, default=False):
        raise SrtError("aborted; nothing changed")


@cache.command()
@config_option
@cache_opt
@click.argument("out", type=click.Path())
@json_opt
def export(cache: str | None, out: str, json: bool) -> None:  # noqa: A002
    """Write a compacted, portable copy of the cache to the new directory OUT."""
    from cache_store.transfer import export as do_export

    as_json = json
    with open_store(cache, readonly=True) as store:
        try:
            size = do_export(store, out)
        except OSError as e:
            raise SrtError(f"{out}: cannot write the export: {e.strerror or e}") from None
    emit(as_json, {"cache": str(store.path), "out": out, "bytes": size},
         [f"exported {store.path} -> {out} ({size:,} bytes)"])


@cache.command(name="import")
@config_option
@cache_opt
@click.argument("src", metavar="IN", type=click.Path())
@json_opt
def import_(cache: str | None, src: str, json: bool) -> None:  # noqa: A002
    """Add the counts of the cache (or export) IN to this cache. Importing twice adds twice."""
    from cache_store.transfer import import_cache

    as_json = json
    with open_store(cache, create=True) as store:
        rep = import_cache(store, src)
    obj = {"cache": str(store.path), "trees": rep.trees, "new": rep.new, "corrupt": rep.corrupt,
           "incompatible": rep.incompatible, "tokens": rep.tokens}
    emit(as_json, obj, [f"imported {rep.trees} trees ({rep.new} new, {rep.tokens:,.0f} tokens) from {src}"
                        + (f"; skipped {rep.corrupt} corrupt" if rep.corrupt else "")
                        + (f"; skipped {rep.incompatible} of another depth" if rep.incompatible else "")])


@cache.command()
@config_option
@cache_opt
@click.argument("source", type=click.Path())
@click.option("--model", default=None, help="Model directory whose tokenizer (and chat template) to use.")
@click.option("--tokenizer-fingerprint", default=None, help="Fingerprint to file token-id rollouts under.")
@click.option("--skip-bad", is_flag=True, help="Count and skip bad lines instead of stopping.")
@click.option("--half-life", type=float, default=None, help="Decay half-life in ticks (new caches only).")
@click.option("--floor", type=float, default=None, help="Counts below this vanish (new caches only).")
@json_opt
def add(cache, source, model, tokenizer_fingerprint, skip_bad, half_life, floor, json) -> None:  # noqa: ANN001, A002
    """Warm the cache from rollouts in a JSONL file or a steps pool (SOURCE)."""
    from srtcli.cache_add import add_rollouts

    as_json = json
    obj = add_rollouts(Path(source), model, tokenizer_fingerprint, skip_bad, cache, half_life, floor, as_json)
    emit(as_json, obj, [
        f"added {obj['rollouts']} rollouts ({obj['tokens']:,} tokens) to {obj['trees']} trees in {obj['cache']}"
        + (f"; skipped {obj['skipped']} bad lines" if obj["skipped"] else "")
    ])
