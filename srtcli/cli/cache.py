"""`srt cache`: inspect, prune, export, import and warm the persistent cache (the sequence store).

    srt cache stats  [--cache DIR] [--json]
    srt cache prune  --max-bytes N | --max-trees N | --older-than 7d | --min-count X | --drop-corrupt
                     [--compact] [--dry-run] [--yes]
    srt cache export OUT        a copy: a compacted LMDB directory, or an empty cache server
    srt cache import IN         append another cache's sequences to this one
    srt cache add SOURCE        warm the cache from rollout JSONL or a steps pool

The cache is `--cache LOCATION` (a directory or a `redis://` URL), else `$SRT_CACHE`, else
`~/.cache/srt`; OUT and IN may be either too, so caches move between LMDB and a server both
ways, record for record. A URL is printed with its password masked. A cache of srt's earlier
tree format is refused by every command (rebuild it with `srt cache add`). stats/prune/export/
import never import torch (only `add` may, to load a tokenizer). The store is
cache_store.store's (opened, exported and imported by cache_store.locations), the printed figures cache_store.report and `add`'s two-pass pipeline
srtcli.cache_add; this module parses flags and prints (`--json`: one JSON object, the last line
of stdout, whose `cache` is the cache directory and `out` what the command wrote, as in every
srt command).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from cache_store.locations import export_store, import_store
from cache_store.store import is_server_url
from srtcli.cli.config import config_option
from srtcli.errors import SrtError
from srtcli.store_link import open_store, shown


def emit(as_json: bool, obj: dict[str, Any], lines: list[str]) -> None:
    """Print the human lines, or the JSON object as the last line of stdout."""
    if as_json:
        click.echo(json.dumps(obj, separators=(",", ":")))
    else:
        for line in lines:
            click.echo(line)


cache_opt = click.option("--cache", default=None,
                         help="Cache directory or redis://[user:password@]host:port/db URL (rediss:// for TLS; "
                              "?prefix=NAME) (default: $SRT_CACHE, else ~/.cache/srt).")
json_opt = click.option("--json", is_flag=True, help="Print one JSON object.")


@click.group()
def cache() -> None:
    """The persistent cache of rollouts per prompt (LMDB, or a Redis server), from which drafting trees are built."""


@cache.command()
@config_option
@cache_opt
@click.option("--top", type=click.IntRange(0, 1000), default=5, show_default=True,
              help="Largest prompts to list (by record bytes).")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Check every record's checksum (reads all records); --no-verify reads only metadata.")
@json_opt
def stats(cache: str | None, top: int, verify: bool, json: bool) -> None:  # noqa: A002 - names are the flags
    """Prompts, sequences, tokens, bytes in memory and on disk, corrupt records, last writes."""
    from cache_store.report import stats_dict, stats_lines

    with open_store(cache, readonly=True) as store:
        st = store.stats(verify=verify, top=top)
    emit(json, stats_dict(st), stats_lines(st))  # `path`: the old name of `cache`


def _criteria(max_bytes, max_trees, older_than, min_count, drop_corrupt):  # noqa: ANN001, ANN202
    from cache_store.clock import parse_duration, parse_size
    from cache_store.seqprune import PruneCriteria

    try:
        crit = PruneCriteria(
            max_bytes=None if max_bytes is None else parse_size(max_bytes),
            max_prompts=max_trees,
            older_than=None if older_than is None else parse_duration(older_than),
            min_count=min_count,
            drop_corrupt=drop_corrupt,
        )
    except ValueError as e:
        raise SrtError(str(e)) from None
    if min_count is not None and not (min_count >= 0):
        raise SrtError(f"--min-count must be >= 0, got {min_count}")
    return crit


def _any(crit) -> bool:  # noqa: ANN001 - a PruneCriteria
    return crit.drop_corrupt or any(v is not None for v in (crit.max_bytes, crit.max_prompts,
                                                             crit.older_than, crit.min_count))


@cache.command()
@config_option
@cache_opt
@click.option("--max-bytes", default=None,
              help="Evict the least recently written prompts until their records take at most N bytes (512M, 2G).")
@click.option("--max-trees", type=click.IntRange(min=0), default=None,
              help="Keep at most N prompts (one tree each), evicting the least recently written.")
@click.option("--older-than", default=None, help="Drop prompts not written for this long (30s, 10m, 12h, 7d).")
@click.option("--min-count", type=float, default=None,
              help="Drop sequences whose decayed weight is below X (no longer nodes: there are no node counts).")
@click.option("--drop-corrupt", is_flag=True, help="Drop records that fail their checksum.")
@click.option("--compact", is_flag=True, help="Shrink the file afterwards (compact copy + atomic swap).")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_opt
def prune(cache, max_bytes, max_trees, older_than, min_count, drop_corrupt, compact, dry_run, yes,
          json) -> None:  # noqa: ANN001, A002 - parameter names are the flag names (--config keys)
    """Drop sequences (corrupt, below a weight) and whole prompts (old, LRU); optionally compact.

    Every prune also removes the sequences already below the cache's floor (never loaded)."""
    from cache_store.report import prune_dict, prune_lines

    crit = _criteria(max_bytes, max_trees, older_than, min_count, drop_corrupt)
    if not _any(crit) and not compact:
        raise SrtError("nothing to do: give --max-bytes, --max-trees, --older-than, --min-count, "
                       "--drop-corrupt or --compact")
    as_json = json
    with open_store(cache) as store:
        plan = store.prune(crit, dry_run=True)
        if dry_run:
            emit(as_json, {"cache": str(store.path), "dry_run": True, **prune_dict(plan)},
                 prune_lines(plan, dry_run=True))
            return
        if compact:  # refuse before pruning, not halfway through
            store.check_compactable()
        _confirm(yes, f"Remove {plan.sequences} of {plan.sequences + plan.sequences_after} sequences "
                 f"({plan.prompts} prompts whole) from {store.path}{' and compact it' if compact else ''}?")
        plan = store.prune(crit)  # planned again inside the write: appends since are judged too
        out = {"cache": str(store.path), "dry_run": False, **prune_dict(plan)}
        lines = prune_lines(plan, dry_run=False)
        if compact:
            before, after = store.compact()
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
@click.argument("out")
@json_opt
def export(cache: str | None, out: str, json: bool) -> None:  # noqa: A002
    """Copy the cache to OUT: a new directory (a compacted, portable LMDB copy) or an empty cache
    server's URL (every record as it is, with the clock and settings)."""
    as_json = json
    with open_store(cache, readonly=True) as store:
        try:
            if is_server_url(out):
                with open_store(out, create=True) as dst:
                    size = export_store(store, dst)
            else:
                size = export_store(store, out)
        except OSError as e:
            raise SrtError(f"{out}: cannot write the export: {e.strerror or e}") from None
    emit(as_json, {"cache": str(store.path), "out": shown(out), "bytes": size},
         [f"exported {store.path} -> {shown(out)} ({size:,} bytes)"])


@cache.command(name="import")
@config_option
@cache_opt
@click.argument("src", metavar="IN")
@json_opt
def import_(cache: str | None, src: str, json: bool) -> None:  # noqa: A002
    """Append the sequences of the cache IN (a directory, an export, or a cache server's URL) to
    this cache, each keeping its age and weight. Importing twice appends twice."""
    from cache_store.report import import_dict, import_line

    as_json = json
    if is_server_url(src):
        with open_store(src, readonly=True) as source:
            where, rep, new = _import(cache, source)
    else:
        with open_store(src, readonly=True):
            pass  # a bad IN is refused before this cache is created
        where, rep, new = _import(cache, src)  # by path: one process opens a directory once
    emit(as_json, {"cache": where, **import_dict(rep, new)}, [import_line(rep, new, shown(src))])


def _import(cache: str | None, source: Any) -> tuple[str, Any, int]:
    """Import `source` (an open store, or a directory) into the cache: where the cache is, the
    report, and how many prompts it did not have."""
    with open_store(cache, create=True) as store:
        before = set(store.uids())
        rep = import_store(store, source)
        return str(store.path), rep, len(set(store.uids()) - before)


@cache.command()
@config_option
@cache_opt
@click.argument("source", type=click.Path())
@click.option("--model", default=None, help="Model directory whose tokenizer (and chat template) to use.")
@click.option("--tokenizer-fingerprint", default=None, help="Fingerprint to file token-id rollouts under.")
@click.option("--skip-bad", is_flag=True, help="Count and skip bad lines instead of stopping.")
@click.option("--half-life", type=float, default=None, help="Decay half-life in ticks (new caches only).")
@click.option("--floor", type=float, default=None,
              help="A sequence whose decayed weight is below this is no longer loaded (new caches only).")
@json_opt
def add(cache, source, model, tokenizer_fingerprint, skip_bad, half_life, floor, json) -> None:  # noqa: ANN001, A002
    """Warm the cache from rollouts in a JSONL file or a steps pool (SOURCE)."""
    from srtcli.cache_add import add_rollouts

    as_json = json
    obj = add_rollouts(Path(source), model, tokenizer_fingerprint, skip_bad, cache, half_life, floor, as_json)
    emit(as_json, obj, [
        f"added {obj['rollouts']} rollouts ({obj['tokens']:,} tokens) of {obj['trees']} prompts to {obj['cache']}"
        + (f"; {obj['with_probs']} with the policy's probabilities" if obj["with_probs"] else "")
        + (f"; skipped {obj['skipped']} bad lines" if obj["skipped"] else "")
    ])
