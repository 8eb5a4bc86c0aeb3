"""Moving sequence stores around: compaction, export, import.

- `compact`: LMDB never shrinks its file, so a compact copy is written beside it and swapped
  in with an atomic rename. Only safe with no other user: it takes `srt.lock` exclusively
  (every open holds it shared) and refuses (CacheBusyError) if anyone else has it. A crash
  leaves the old or the new file whole, plus a stray `.compact-*` folder that the next
  compaction removes.
- `export`: a compacted copy (one consistent snapshot, safe while others write) in a new
  directory; itself a sequence store, portable to hosts of the same byte order and word size.
- `import_from`: appends every sequence of another store in one write transaction. Each
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
from typing import Any

import lmdb

from cache_store import seqenv, seqrecord
from cache_store.clock import decay_factor
from cache_store.errors import CacheError, CorruptRecord
from cache_store.seqenv import SeqEnv


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
    """What `import_from` appended and skipped."""

    prompts: int = 0     # prompts that received sequences
    sequences: int = 0
    tokens: int = 0
    below_floor: int = 0  # source sequences already below the source's floor
    corrupt: int = 0      # source records that failed their checksum

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _restamped(value: memoryview, src: dict, now: int, hl: float) -> bytes | None:
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


def _gather(src: SeqEnv, now: int, hl: float) -> tuple[ImportReport, dict[str, list[tuple[bytes, int]]]]:
    """Every source record restamped for this store, per uid (from one source snapshot)."""
    rep, batch = ImportReport(), {}

    def fn(txn: lmdb.Transaction) -> None:
        info = src.get_info(txn)
        for key, value in txn.cursor(db=src.dbs["seqs"]):
            try:
                rec = _restamped(value, info, now, hl)
            except CorruptRecord:
                rep.corrupt += 1
                continue
            if rec is None:
                rep.below_floor += 1
                continue
            batch.setdefault(bytes(key[:-4]).decode(), []).append((rec, seqrecord.check(rec).tokens))

    src.read(fn, buffers=True)
    return rep, batch


def import_from(h: SeqEnv, put, src_path: str | Path) -> ImportReport:  # noqa: ANN001
    """Append every sequence of the store at `src_path`; `put(txn, uid, records, tokens)`
    appends one prompt's records inside the write transaction (LmdbSequenceStore._put)."""
    src_path = Path(src_path)
    if os.path.realpath(src_path) == os.path.realpath(h.path):
        raise CacheError(f"{src_path}: cannot import a cache into itself")
    src = seqenv.open_seq_env(src_path, create=False, readonly=True, half_life=1.0, floor=0.0)
    try:
        def fn(txn: lmdb.Transaction) -> ImportReport:
            info = h.get_info(txn)
            rep, batch = _gather(src, int(info["tick"]), info["half_life"])
            for uid, recs in batch.items():
                put(txn, uid, [r for r, _ in recs], sum(n for _, n in recs))
                rep.prompts, rep.sequences = rep.prompts + 1, rep.sequences + len(recs)
                rep.tokens += sum(n for _, n in recs)
            return rep

        return h.write(fn)
    finally:
        src.release()
