"""Pruning a sequence store: drop the sequences whose decayed weight is below a floor (and,
if asked, corrupt records), then rewrite the meta records of the prompts that changed.

Runs inside one write transaction (LMDB serialises it with appends, so a concurrent append
is either seen whole or lands after). Only record headers are read: nothing is decompressed.
A prompt left without sequences loses its meta record too. The data file does not shrink
until it is compacted (LMDB reuses the freed pages for later appends).
"""

from __future__ import annotations

import lmdb

from cache_store import seqrecord
from cache_store.clock import decay_factor
from cache_store.errors import CorruptRecord
from cache_store.seqenv import SeqEnv


def prune_records(env: SeqEnv, txn: lmdb.Transaction, floor: float | None, drop_corrupt: bool) -> int:
    """Delete what falls below `floor` (None: the store's floor) or is corrupt (if asked)."""
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
        if uid not in kept:
            txn.delete(uid, db=env.dbs["meta"])
            continue
        nxt, _s, _t, wall, _b = env.get_meta(txn, uid)
        seqs, toks, nbytes = kept[uid]
        env.put_meta(txn, uid, (nxt, seqs, toks, wall, nbytes))
    return len(doomed)
