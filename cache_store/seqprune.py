"""Pruning a sequence store: drop the sequences whose decayed weight is below a floor (and,
if asked, corrupt records), then rewrite the meta records of the prompts that changed.

Runs inside one write transaction (LMDB serialises it with appends, so a concurrent append
is either seen whole or lands after). Only record headers are read: nothing is decompressed.
A prompt left without sequences loses its meta record too. The data file does not shrink
until it is compacted (LMDB reuses the freed pages for later appends).
"""

from __future__ import annotations

import struct

import lmdb

from cache_store import seqrecord
from cache_store.clock import decay_factor
from cache_store.errors import CorruptRecord


def prune_records(env, txn: lmdb.Transaction, floor: float | None, drop_corrupt: bool) -> int:  # noqa: ANN001
    """Delete what falls below `floor` (None: the store's floor) or is corrupt (if asked)."""
    from cache_store.seqstore import _META

    info = env.get_info(txn)
    now, hl = int(info["tick"]), info["half_life"]
    floor = info["floor"] if floor is None else floor
    doomed: list[bytes] = []
    kept: dict[bytes, list[int]] = {}  # uid -> [sequences, tokens, bytes] that remain
    for key, value in txn.cursor(db=env.dbs["seqs"]):
        uid = bytes(key[:-4])
        try:
            head = seqrecord.check(value)
        except CorruptRecord:
            if drop_corrupt:
                doomed.append(bytes(key))
            continue
        if head.weight * decay_factor(now, head.tick, hl) < floor:
            doomed.append(bytes(key))
            continue
        k = kept.setdefault(uid, [0, 0, 0])
        k[0], k[1], k[2] = k[0] + 1, k[1] + head.tokens, k[2] + head.disk_bytes
    for key in doomed:
        txn.delete(key, db=env.dbs["seqs"])
    touched = {k[:-4] for k in doomed}
    for uid in touched:
        raw = txn.get(uid, db=env.dbs["meta"])
        if uid not in kept:
            txn.delete(uid, db=env.dbs["meta"])
            continue
        nxt, _s, _t, wall, _b = _META.unpack(raw) if raw is not None and len(raw) == _META.size else (
            _next_after(env, txn, uid), 0, 0, 0.0, 0)
        seqs, toks, nbytes = kept[uid]
        txn.put(uid, _META.pack(nxt, seqs, toks, wall, nbytes), db=env.dbs["meta"])
    return len(doomed)


def _next_after(env, txn: lmdb.Transaction, uid: bytes) -> int:  # noqa: ANN001
    nxt = 0
    with txn.cursor(db=env.dbs["seqs"]) as cur:
        if cur.set_range(uid + b"\0\0\0\0"):
            for k in cur.iternext(values=False):
                if not bytes(k).startswith(uid):
                    break
                nxt = struct.unpack(">I", bytes(k)[-4:])[0] + 1
    return nxt
