"""Reliability of the sequence store's maintenance with real processes on a real LMDB:
compactions SIGKILLed at random points, compaction refused while others use the store, a
pruner racing appending writers, reader slots of killed processes. (SIGKILLed and concurrent
appenders, and flipped bytes, are in test_seqstore.py.)"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from cache_store import seqrecord
from cache_store.errors import CacheBusyError
from cache_store.locations import import_store
from cache_store.seqenv import META
from cache_store.seqstore import LmdbSequenceStore, PruneCriteria
from cache_store.uid import prompt_uid

UIDS = [prompt_uid([k], "reliability") for k in range(3)]


def rollout(i: int) -> list[int]:
    r = random.Random(i)
    return [r.randrange(50) for _ in range(40)]


def stored(path) -> dict[str, Counter]:
    """Every prompt's sequences as a multiset; every record must pass its checksum, and the
    meta records must agree with the records."""
    s = LmdbSequenceStore.open(path)  # every reopen must succeed
    try:
        out = {}
        for uid in s.uids():
            recs = s.raw_records(uid)
            for _k, rec in recs:
                seqrecord.check(rec)
            out[uid] = Counter(tuple(x.tokens.tolist()) for x in s.read(uid))
            assert sum(out[uid].values()) == len(recs)
        assert s.stats().sequences == sum(sum(c.values()) for c in out.values())
        return out
    finally:
        s.close()


def meta_in_step(s: LmdbSequenceStore) -> bool:
    """In one snapshot: do the meta records count exactly the records there are?"""
    e = s._e

    def fn(txn) -> bool:  # noqa: ANN001
        records = Counter(bytes(k[:-4]) for k in txn.cursor(db=e.dbs["seqs"]).iternext(values=False))
        metas = {bytes(k): META.unpack(v)[1] for k, v in txn.cursor(db=e.dbs["meta"])}
        return metas == dict(records)

    return e.read(fn)


COMPACTOR = r"""
import sys
from cache_store.seqstore import LmdbSequenceStore
s = LmdbSequenceStore.open(sys.argv[1])
print("ready", flush=True)
while True:
    s.compact()
"""


@pytest.mark.slow
def test_a_compaction_killed_anywhere_leaves_the_store_whole(tmp_path):
    path = tmp_path / "s"
    s = LmdbSequenceStore.open(path)
    for k, u in enumerate(UIDS):
        s.append(u, [rollout(10 * k + j) for j in range(20)])
    s.prune(PruneCriteria(max_prompts=2))  # free pages, so compaction has something to do
    s.close()
    want = stored(path)
    rng = random.Random(11)
    for _ in range(8):
        p = subprocess.Popen([sys.executable, "-c", COMPACTOR, str(path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.2))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert stored(path) == want
    s = LmdbSequenceStore.open(path)
    before, after = s.compact()  # a later compaction clears what a killed one left behind
    assert after <= before and stored(path) == want
    s.close()
    assert not list(path.glob(".compact-*"))


HOLDER = r"""
import sys, time
from cache_store.seqstore import LmdbSequenceStore
s = LmdbSequenceStore.open(sys.argv[1], readonly=sys.argv[2] == "ro")
print("open", flush=True)
time.sleep(60)
"""


def test_compaction_is_refused_while_anyone_else_has_the_store_open(tmp_path):
    path = tmp_path / "s"
    s = LmdbSequenceStore.open(path)
    s.append(UIDS[0], [rollout(0)])
    again = LmdbSequenceStore.open(path)  # a second open in this process
    with pytest.raises(CacheBusyError, match="in use"):
        s.compact()
    again.close()
    for mode in ("rw", "ro"):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "open"
        with pytest.raises(CacheBusyError, match="another process"):
            s.check_compactable()
        with pytest.raises(CacheBusyError, match="another process"):
            s.compact()
        p.kill()
        p.wait()
        p.stdout.close()
    s.append(UIDS[0], [rollout(1)])  # the shared lock was taken back after each refusal
    s.compact()
    assert sum(stored(path)[UIDS[0]].values()) == 2
    s.close()


APPENDER = r"""
import random, sys
from cache_store.seqstore import LmdbSequenceStore
from cache_store.uid import prompt_uid
path, start, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
UIDS = [prompt_uid([k], "reliability") for k in range(3)]
def rollout(i):
    r = random.Random(i)
    return [r.randrange(50) for _ in range(40)]
s = LmdbSequenceStore.open(path)
for i in range(start, start + n):
    s.append_many({UIDS[i % 3]: [rollout(i)]})
s.close()
"""


@pytest.mark.slow
def test_a_pruner_racing_appenders_removes_only_what_it_selects(tmp_path):
    """Over and over, light sequences (weight 0.25) are imported into the prompts two writer
    processes append to (weight 1), and pruned again with min_count 0.5: every append survives
    and the meta records stay in step with the records (a prune that planned in an earlier
    snapshot than the one it deletes in would miscount the appends in between)."""
    light = LmdbSequenceStore.open(tmp_path / "light", half_life=1.0)
    light.append_many({u: [rollout(-1 - k)] for k, u in enumerate(UIDS)})
    light.tick(2)
    light.close()
    path = tmp_path / "s"
    s = LmdbSequenceStore.open(path, half_life=1.0)
    s.tick(2)
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(w * 1000), "40"]) for w in range(2)]
    imported = removed = 0
    while any(p.poll() is None for p in procs):
        imported += import_store(s, tmp_path / "light").sequences
        removed += s.prune(PruneCriteria(min_count=0.5)).sequences
        assert meta_in_step(s)
    assert [p.returncode for p in procs] == [0, 0]
    s.close()
    want = {u: Counter() for u in UIDS}
    for i in [*range(0, 40), *range(1000, 1040)]:
        want[UIDS[i % 3]][tuple(rollout(i))] += 1
    assert removed == imported > 0 and stored(path) == want


READER = r"""
import sys, time
from cache_store.seqstore import LmdbSequenceStore
s = LmdbSequenceStore.open(sys.argv[1])
txn = s._e.env.begin()  # a read snapshot that pins pages until it ends
print("reading", flush=True)
time.sleep(60)
"""


def test_reader_slots_of_killed_processes_are_cleared_on_open(tmp_path):
    path = tmp_path / "s"
    holder = LmdbSequenceStore.open(path)  # keeps the environment in use, so LMDB never resets its lock table
    p = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "reading"
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    dead = f" {p.pid} "
    env = holder._e.env
    assert dead in env.readers()  # the dead reader still holds its slot...
    opener = ("import sys; from cache_store.seqstore import LmdbSequenceStore as S; "
              "print(S.open(sys.argv[1])._e.env.readers())")
    out = subprocess.run([sys.executable, "-c", opener, str(path)], capture_output=True, text=True, check=True)
    assert dead not in out.stdout  # ...until another process opens the store (reader_check)
    assert dead not in env.readers()
    holder.close()
