"""Human-readable lines for `srt cache stats` and `srt cache prune` (the --json forms are the
dataclasses' dicts; this only words them)."""

from __future__ import annotations

import time

from cache_store.prune import PrunePlan
from cache_store.stats import CacheStats


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    s = max(0.0, now - t)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t))} UTC ({s / size:.1f}{unit} ago)"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t))} UTC ({s:.0f}s ago)"


def stats_lines(st: CacheStats) -> list[str]:
    """`srt cache stats` as text."""
    now = time.time()
    lines = [
        f"cache        {st.path}",
        f"trees        {st.trees:,}",
        f"nodes        {st.nodes:,}",
        f"tokens       {st.tokens:,.1f} (count mass decayed to tick {st.tick})",
        f"disk         {st.disk_bytes:,} bytes (pages in use {st.used_bytes:,}; live records {st.live_bytes:,})",
        f"compression  {st.compression_ratio:.2f}x ({st.raw_bytes:,} bytes uncompressed)",
        f"corrupt      {'not checked (--no-verify)' if st.corrupt is None else st.corrupt}"
        + (f" (first: {', '.join(st.corrupt_uids[:3])})" if st.corrupt else ""),
        f"decay        half-life {st.half_life:g} ticks, floor {st.floor:g}",
        f"oldest       {_ago(st.oldest_access, now)}",
        f"newest       {_ago(st.newest_access, now)}",
    ]
    if st.missing_meta:
        lines.append(f"missing meta {st.missing_meta} (counted as trees, without sizes)")
    if st.largest:
        lines.append("largest trees:")
        for t in st.largest:
            lines.append(f"  {t.uid}  {t.disk_bytes:>10,} B  {t.nodes:>9,} nodes  {t.tokens:>12,.1f} tokens")
    return lines


def prune_lines(plan: PrunePlan, dry_run: bool) -> list[str]:
    """`srt cache prune` as text."""
    verb = "would remove" if dry_run else "removed"
    lines = [
        f"{verb} {len(plan.evicted())} of {plan.trees_before} trees: "
        f"{len(plan.corrupt)} corrupt, {len(plan.old)} old, {len(plan.trimmed_empty)} emptied by "
        f"--min-count, {len(plan.lru)} least recently used",
        f"trees {plan.trees_before:,} -> {plan.trees_after:,}; "
        f"record bytes {plan.bytes_before:,} -> {plan.bytes_after:,}",
    ]
    if plan.nodes_trimmed:
        lines.append(f"{'would trim' if dry_run else 'trimmed'} {plan.nodes_trimmed:,} nodes below --min-count")
    return lines
