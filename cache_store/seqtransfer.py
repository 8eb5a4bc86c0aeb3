"""Moving sequence stores around: compaction, export, import, between any two backends.

- `compact`: LMDB never shrinks its file, so a compact copy is written beside it and swapped
  in with an atomic rename. Only safe with no other user: it takes `srt.lock` exclusively
  (every open holds it shared) and refuses (CacheBusyError) if anyone else has it. A crash
  leaves the old or the new file whole, plus a stray `.compact-*` folder that the next
  compaction removes.
- `export`: LMDB to LMDB, a compacted copy (one consistent snapshot, safe while others write)
  in a new directory; itself a sequence store, portable to hosts of the same byte order and
  word size.
- `copy_store(src, dst)`: any backend into an empty store of any backend (LMDB <-> a cache
  server, cache_store.redis_store): the header's clock, settings and creation time, then every
  record byte for byte with each prompt's last write time. Only the store interface is used
  (`cache_store.store.SequenceStore`), so LMDB -> server -> LMDB gives back the same records.
- `merge_store(src, dst)` (`import`): appends every sequence of another store. Each
  record keeps its age (source now - written tick) and weight, so it decays on from where it
  was: written at the source's tick s with weight w, it lands at tick (now - (S - s)) with
  weight w when the half-lives agree and that tick is not negative; otherwise at tick now with
  its weight decayed to the source's now. Sequences already below the source's floor (never
  loaded there) and corrupt records are skipped and counted. Importing twice appends twice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from cache_store import seqenv, seqrecord
from cache_store.clock import decay_factor
from cache_store.errors import CacheError, CorruptRecord
from cache_store.seqenv import SeqEnv
from cache_store.store import SequenceStore


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_compact(h: SeqEnv, out: Path) -> None:
    h.env.copy(str(out), compact=True)
    _fsync_path(out / "data.mdb")


def compact(h: SeqEnv) -> tuple[int, int]:
    """Shrink the data file to its live pages; (bytes before, bytes after)."""
    seqenv.exclusive(h)
    try:
        for stale in h.path.glob(".compact-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed compaction
        data = h.path / "data.mdb"
        before = data.stat().st_size
        tmp = Path(tempfile.mkdtemp(prefix=".compact-", dir=h.path))
        _copy_compact(h, tmp)
        map_size = h.env.info()["map_size"]
        h.env.close()
        os.replace(tmp / "data.mdb", data)  # atomic: the old file or the new one, whole
        _fsync_path(h.path)
        shutil.rmtree(tmp, ignore_errors=True)
        seqenv.reopen(h, map_size)
        return before, data.stat().st_size
    finally:
        seqenv.share(h)


def check_compactable(h: SeqEnv) -> None:
    """CacheBusyError now if `compact` would be refused (so a prune can stop before deleting)."""
    seqenv.exclusive(h)
    seqenv.share(h)


def export(h: SeqEnv, dst: str | Path) -> int:
    """A compacted copy into `dst` (new, or an empty directory); its data file's size."""
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CacheError(f"{dst}: already exists and is not an empty directory")
    dst.mkdir(parents=True, exist_ok=True)
    _copy_compact(h, dst)
    return (dst / "data.mdb").stat().st_size


@dataclass
class ImportReport:
    """What `merge_store` appended and skipped (or `copy_store` copied)."""

    prompts: int = 0     # prompts that received sequences
    sequences: int = 0
    tokens: int = 0
    below_floor: int = 0  # source sequences already below the source's floor
    corrupt: int = 0      # source records that failed their checksum (a copy takes them as they are)
    bytes: int = 0        # record bytes written

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, recs: Sequence[bytes]) -> None:
        self.prompts, self.sequences = self.prompts + 1, self.sequences + len(recs)
        self.tokens += sum(map(seqrecord.peek_tokens, recs))
        self.bytes += sum(map(len, recs))


COPY_PROMPTS = 256  # prompts read and written at a time: a copy holds only these in memory


def copy_store(src: SequenceStore, dst: SequenceStore) -> ImportReport:
    """Copy `src` into the empty store `dst`: its clock, settings and creation time, then each
    prompt's records byte for byte, in order (corrupt ones too, counted), with its last write
    time; record numbers are dense again in `dst`. CacheError if `dst` holds prompts."""
    if dst.uids():
        raise CacheError(f"{dst.path}: not empty; a copy goes into an empty cache (import merges)")
    dst.adopt_header(src.info())
    walls, uids, rep = src.last_writes(), src.uids(), ImportReport()
    for i in range(0, len(uids), COPY_PROMPTS):
        batch = {uid: [v for _, v in src.raw_records(uid)] for uid in uids[i:i + COPY_PROMPTS]}
        batch = {uid: recs for uid, recs in batch.items() if recs}
        dst.append_raw(batch, walls)
        for recs in batch.values():
            rep.add(recs)
            rep.corrupt += sum(1 for r in recs if not _valid(r))
    return rep


def _valid(rec: bytes) -> bool:
    try:
        seqrecord.check(rec)
    except CorruptRecord:
        return False
    return True


def _restamped(value: bytes, src: Mapping[str, float], now: int, hl: float) -> bytes | None:
    """The record as it lands here (see the module docstring); None below the source floor."""
    head = seqrecord.check(value)
    src_now = int(src["tick"])
    age = max(src_now - head.tick, 0)
    weight = head.weight * decay_factor(src_now, head.tick, src["half_life"])
    if weight < src["floor"] or not weight > 0:
        return None
    if src["half_life"] == hl and now >= age:
        return seqrecord.restamp(value, now - age, head.weight)
    return seqrecord.restamp(value, now, weight)


def merge_store(src: SequenceStore, dst: SequenceStore) -> ImportReport:
    """Append every sequence of `src` to `dst`, each keeping its age and weight (the module
    docstring), in one `append_raw` (LMDB: one write transaction); sequences below the source's
    floor and corrupt records are skipped and counted. Importing twice appends twice."""
    if src is dst or str(src.path) == str(dst.path):
        raise CacheError(f"{src.path}: cannot import a cache into itself")
    info, src_info = dst.info(), src.info()
    rep, batch = ImportReport(), {}
    for uid in src.uids():
        recs = []
        for _key, value in src.raw_records(uid):
            try:
                rec = _restamped(value, src_info, int(info["tick"]), info["half_life"])
            except CorruptRecord:
                rep.corrupt += 1
                continue
            if rec is None:
                rep.below_floor += 1
            else:
                recs.append(rec)
        if recs:
            batch[uid] = recs
            rep.add(recs)
    dst.append_raw(batch)
    return rep
