"""What `srt cache stats`, `prune` and `import` print: their --json objects and their lines.

The objects keep the key names earlier srt versions printed wherever the meaning survived the
move to the sequence store (docs/cache.md, "`srt cache stats`"): `trees` is the number of
prompts (one tree each when loaded), `live_bytes` the stored records, `oldest_access` /
`newest_access` the last writes (loads are not recorded), and so on; the new figures
(sequences, bytes in memory when loaded, ...) come under their own names.
"""

from __future__ import annotations

import time
from typing import Any

from cache_store.seqprune import PrunePlan
from cache_store.seqstats import SeqStoreStats
from cache_store.seqtransfer import ImportReport

TOKEN_BYTES = 4  # a token is an int32 when uncompressed (and in a loaded tree)


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    s = max(0.0, now - t)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{stamp} UTC ({s / size:.1f}{unit} ago)"
    return f"{stamp} UTC ({s:.0f}s ago)"


def compression_ratio(st: SeqStoreStats) -> float | None:
    """Raw int32 token bytes over stored record bytes (None for an empty store)."""
    return TOKEN_BYTES * st.tokens / st.record_bytes if st.record_bytes else None


def stats_dict(st: SeqStoreStats) -> dict[str, Any]:
    """`srt cache stats --json`: every SeqStoreStats field, plus the earlier names."""
    return {"cache": st.path, **st.to_dict(), "trees": st.prompts, "live_bytes": st.record_bytes,
            "compression_ratio": compression_ratio(st), "oldest_access": st.oldest_write,
            "newest_access": st.newest_write}


def _memory_line(st: SeqStoreStats) -> str:
    if st.memory_bytes is None:
        return "memory       - (nothing stored)"
    return (f"memory       about {st.memory_bytes:,} bytes when every prompt is loaded "
            f"({st.memory_per_token:,.0f} B per token, measured on the largest prompt)")


def stats_lines(st: SeqStoreStats) -> list[str]:
    """`srt cache stats` as text."""
    now = time.time()
    ratio = compression_ratio(st)
    lines = [
        f"cache        {st.path}",
        f"prompts      {st.prompts:,} (one tree each when loaded)",
        f"sequences    {st.sequences:,}",
        f"tokens       {st.tokens:,} stored",
        _memory_line(st),
        f"disk         {st.disk_bytes:,} bytes (pages in use {st.used_bytes:,}; records {st.record_bytes:,})",
        f"compression  {'-' if ratio is None else f'{ratio:.2f}x'} (int32 tokens / record bytes)",
        f"corrupt      {'not checked (--no-verify)' if st.corrupt is None else st.corrupt}"
        + (f" (first: {', '.join(st.corrupt_uids[:3])})" if st.corrupt else ""),
        f"decay        half-life {st.half_life:g} ticks, floor {st.floor:g} per sequence, tick {st.tick}",
        f"oldest write {_ago(st.oldest_write, now)}",
        f"newest write {_ago(st.newest_write, now)}",
    ]
    if st.largest:
        lines.append("largest prompts:")
        for p in st.largest:
            lines.append(f"  {p.uid}  {p.disk_bytes:>10,} B  {p.sequences:>7,} sequences  {p.tokens:>11,} tokens")
    return lines


def prune_dict(plan: PrunePlan) -> dict[str, Any]:
    """`srt cache prune --json` (without `cache`, `dry_run` and the compaction's sizes)."""
    emptied = plan.prompts - len(plan.old) - len(plan.lru)
    return {
        "trees_before": plan.prompts_after + plan.prompts, "trees_after": plan.prompts_after,
        "trees_removed": plan.prompts, "bytes_before": plan.bytes_after + plan.bytes,
        "bytes_after": plan.bytes_after, "corrupt_dropped": plan.corrupt, "old_dropped": len(plan.old),
        "lru_evicted": len(plan.lru), "trimmed_empty": emptied, "light_dropped": plan.light,
        "sequences_before": plan.sequences_after + plan.sequences, "sequences_after": plan.sequences_after,
        "sequences_removed": plan.sequences, "tokens_removed": plan.tokens,
        "old_uids": plan.old, "lru_uids": plan.lru,
    }


def prune_lines(plan: PrunePlan, dry_run: bool) -> list[str]:
    """`srt cache prune` as text."""
    d = prune_dict(plan)
    verb = "would remove" if dry_run else "removed"
    return [
        f"{verb} {d['sequences_removed']:,} of {d['sequences_before']:,} sequences: {d['corrupt_dropped']} corrupt, "
        f"{d['light_dropped']:,} below the weight threshold, the rest with their prompts",
        f"prompts {d['trees_before']:,} -> {d['trees_after']:,}: {d['old_dropped']} old, "
        f"{d['lru_evicted']} least recently written, {d['trimmed_empty']} left empty",
        f"record bytes {d['bytes_before']:,} -> {d['bytes_after']:,}",
    ]


def import_dict(rep: ImportReport, new: int) -> dict[str, Any]:
    """`srt cache import --json` (without `cache`); `new`: prompts this cache did not have."""
    return {"trees": rep.prompts, "new": new, "sequences": rep.sequences, "tokens": rep.tokens,
            "corrupt": rep.corrupt, "below_floor": rep.below_floor}


def import_line(rep: ImportReport, new: int, src: str) -> str:
    """`srt cache import` as text."""
    return (f"imported {rep.sequences:,} sequences ({rep.tokens:,} tokens) of {rep.prompts} prompts "
            f"({new} new) from {src}"
            + (f"; skipped {rep.corrupt} corrupt" if rep.corrupt else "")
            + (f"; skipped {rep.below_floor} below the source's floor" if rep.below_floor else ""))
