"""Directories the cache tests refuse (someone else's LMDB, and srt's earlier tree cache), and
the random search that shows a deliberately wrong variant is caught."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import hypothesis
import lmdb
from hypothesis import HealthCheck, Phase, settings


def dir_digest(d: Path) -> dict[str, bytes]:
    """Every name in a directory with its bytes (LMDB's lock file included)."""
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir())}


def foreign_lmdb(path: Path) -> Path:
    """An LMDB that is not srt's, with even a sub-database named like ours."""
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
        txn.put(b"a", b"b", db=env.open_db(b"info", txn=txn))
    env.close()
    return path


def old_format_cache(path: Path) -> Path:
    """A cache as srt's earlier tree store left it: its header (format b"srt-cache"), its
    `trees` and `meta` sub-databases with one record, and its `srt.lock`."""
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True) as txn:
        info = env.open_db(b"info", txn=txn)
        for k, v in ((b"format", b"srt-cache"), (b"version", b"1"), (b"tick", struct.pack("<Q", 3)),
                     (b"half_life", struct.pack("<d", 100.0)), (b"floor", struct.pack("<d", 0.1)),
                     (b"created", struct.pack("<d", time.time()))):
            txn.put(k, v, db=info)
        txn.put(b"0" * 32, b"SRTC tree record", db=env.open_db(b"trees", txn=txn))
        txn.put(b"0" * 32, b"meta record", db=env.open_db(b"meta", txn=txn))
    env.close()
    (path / "srt.lock").touch()
    return path


def first_caught(strategy, caught) -> object:
    """The first example of `strategy` (up to 3,000, no shrinking: the same random search a main
    test runs) for which `caught(example)` holds; hypothesis fails the test if there is none."""
    return hypothesis.find(strategy, caught, settings=settings(
        max_examples=3000, deadline=None, database=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck)))
