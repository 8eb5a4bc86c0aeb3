"""Reliability with real processes on a real LMDB: writers SIGKILLed at random points,
concurrent writers into the same trees, and flipped bytes in a stored record."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest

from cache_store.codec import HEADER_BYTES, check_record, decode_record
from cache_store.errors import CorruptRecord
from cache_store.stats import cache_stats
from cache_store.store import CacheStore
from cache_store.transfer import compact
from cache_store.trie import TokenTree
from cache_store.uid import prompt_uid

UIDS = [prompt_uid([k], "reliability") for k in range(3)]

# A writer: commits deltas i = start, start+1, ...; delta i goes to two trees in ONE
# transaction, so a torn transaction would show as the two trees disagreeing. It prints
# `begin i` before and `done i` after each commit returns. mode "naive" is the wrong
# variant: load, add, then overwrite in a separate transaction (lost updates).
WRITER = r"""
import sys, time
from cache_store import env as envmod
from cache_store.store import CacheStore
from cache_store.transfer import compact
from cache_store.trie import TokenTree
from cache_store.uid import prompt_uid

path, start, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
UIDS = [prompt_uid([k], "reliability") for k in range(3)]

def delta(i):
    import random
    r = random.Random(i)
    t = TokenTree(max_depth=4)
    t.insert([r.randrange(6) for _ in range(12)])
    return t

s = CacheStore.open(path)
print("ready", flush=True)
if mode != "kill":
    sys.stdin.readline()  # wait for "go": all writers start together
for i in range(start, start + n):
    d = delta(i)
    targets = [UIDS[i % 3], UIDS[(i + 1) % 3]] if mode == "kill" else [UIDS[i % 2]]
    print("begin", i, flush=True)
    if mode == "naive":
        tree = s.load(targets[0]) or TokenTree(max_depth=4)
        time.sleep(0.002)  # the window in which another writer commits
        tree.merge(d)
        envmod.write(s.handle(), lambda txn: s.put_tree(txn, targets[0].encode(), tree, 0, time.time()))
    else:
        s.commit_many({u: d for u in targets})
    print("done", i, flush=True)
s.close()
"""


def delta(i: int) -> TokenTree:
    r = random.Random(i)
    t = TokenTree(max_depth=4)
    t.insert([r.randrange(6) for _ in range(12)])
    return t


def expected_trees(indices, targets_of) -> dict[str, bytes]:
    trees = {u: TokenTree(max_depth=4) for u in UIDS}
    for i in indices:
        for u in targets_of(i):
            trees[u].merge(delta(i))
    return {u: t.to_bytes() for u, t in trees.items() if t.nodes}


def stored_trees(path) -> dict[str, bytes]:
    s = CacheStore.open(path)  # every reopen must succeed
    try:
        for uid, head, _meta in s.scan():
            assert not isinstance(head, CorruptRecord), f"torn or corrupt record {uid}: {head}"
        return {u: t.to_bytes() for u in UIDS if (t := s.load(u)) is not None}
    finally:
        s.close()


def spawn(path, start, n, mode):
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(start), str(n), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


@pytest.mark.slow
def test_sigkilled_writers_never_lose_or_tear_a_commit(tmp_path):
    path = tmp_path / "c"
    CacheStore.open(path).close()
    rng = random.Random(7)
    kill_targets = lambda i: [UIDS[i % 3], UIDS[(i + 1) % 3]]  # noqa: E731
    committed: list[int] = []
    nxt = 0
    landed_inflight = 0
    for _ in range(32):
        p = spawn(path, nxt, 10**6, "kill")
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.12))
        p.send_signal(signal.SIGKILL)
        p.wait()
        lines = p.stdout.read().split("\n")[:-1]  # whole lines only: the kill can cut the last one
        p.stdout.close()
        done = [int(x.split()[1]) for x in lines if x.startswith("done")]
        begun = [int(x.split()[1]) for x in lines if x.startswith("begin")]
        inflight = [i for i in begun if i not in done]
        got = stored_trees(path)
        base = committed + done
        if got == expected_trees(base, kill_targets):
            committed = base
        else:  # the commit in flight when killed may have landed: all of it, never half
            assert inflight and got == expected_trees(base + inflight, kill_targets), "lost or torn commit"
            committed = base + inflight
            landed_inflight += 1
        nxt = max(begun, default=nxt - 1) + 1
    print(f"{len(committed)} commits, {landed_inflight} in-flight commits landed before the kill")
    assert len(committed) > 32  # the writers got real work done between kills


def _run_concurrently(path, mode: str, writers: int = 3, each: int = 20) -> list[int]:
    procs = [spawn(path, w * 1000, each, mode) for w in range(writers)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    done = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        done += [int(x.split()[1]) for x in out.splitlines() if x.startswith("done")]
    return done


@pytest.mark.slow
def test_concurrent_writers_sum_exactly(tmp_path):
    path = tmp_path / "c"
    CacheStore.open(path).close()
    done = _run_concurrently(path, "merge")
    assert len(done) == 60
    assert stored_trees(path) == expected_trees(done, lambda i: [UIDS[i % 2]])


@pytest.mark.slow
def test_the_checker_catches_lost_updates_of_a_blind_overwrite(tmp_path):
    """The wrong variant (load, add, overwrite) loses counts under the same race."""
    path = tmp_path / "c"
    CacheStore.open(path).close()
    done = _run_concurrently(path, "naive")
    got = stored_trees(path)
    want = expected_trees(done, lambda i: [UIDS[i % 2]])
    mass = lambda b: TokenTree.from_bytes(b).mass  # noqa: E731
    assert sum(map(mass, got.values())) < sum(map(mass, want.values()))


def test_flipped_bytes_are_found_skipped_and_prunable(tmp_path):
    from cache_store.prune import PruneCriteria, apply_prune, plan_prune

    s = CacheStore.open(tmp_path / "c")
    s.commit_many({UIDS[0]: delta(1), UIDS[1]: delta(2)})
    rec = bytearray(s.raw_record(UIDS[0]))
    rec[len(rec) // 2] ^= 0x04
    with s.env.begin(write=True) as txn:
        txn.put(UIDS[0].encode(), bytes(rec), db=s.handle().dbs["trees"])
    st = cache_stats(s)
    assert (st.trees, st.corrupt, st.corrupt_uids) == (1, 1, [UIDS[0]])
    with pytest.warns(UserWarning, match="corrupt"):
        assert s.load(UIDS[0]) is None
    assert s.load(UIDS[1]) is not None  # the other tree is unaffected
    crit = PruneCriteria(drop_corrupt=True)
    apply_prune(s, crit, plan_prune(s, crit))
    assert cache_stats(s).corrupt == 0 and s.load(UIDS[1]) is not None
    s.close()


def test_the_checksum_is_what_catches_flips(tmp_path):
    """Every single-byte flip of a record is caught; without the CRC (zstd frame and node
    table validation alone: the wrong variant) some flips decode silently to another tree."""
    t = TokenTree(max_depth=8)
    r = random.Random(3)
    for _ in range(20):
        t.insert([r.randrange(30) for _ in range(30)])
    s = CacheStore.open(tmp_path / "c")
    s.commit(UIDS[0], t)
    rec = s.raw_record(UIDS[0])
    s.close()
    _, table = decode_record(rec)
    import zstandard

    silent = 0
    for i in range(HEADER_BYTES, len(rec)):
        bad = bytearray(rec)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecord):
            check_record(bytes(bad))
        try:  # no checksum: trust whatever decompresses and parses
            out = zstandard.ZstdDecompressor().decompress(bytes(bad[HEADER_BYTES:]), max_output_size=len(table))
            if TokenTree.from_bytes(out).to_bytes() != table:
                silent += 1
        except (zstandard.ZstdError, ValueError):
            pass
    assert silent > 0


COMPACTOR = r"""
import sys
from cache_store.store import CacheStore
from cache_store.transfer import compact
from cache_store.transfer import compact
s = CacheStore.open(sys.argv[1])
print("ready", flush=True)
while True:
    compact(s)
"""


@pytest.mark.slow
def test_a_compaction_killed_anywhere_leaves_the_cache_whole(tmp_path):
    path = tmp_path / "c"
    s = CacheStore.open(path)
    s.commit_many({u: delta(k) for k, u in enumerate(UIDS)})
    s.delete_many(UIDS[2:])  # free pages, so compaction has something to do
    s.close()
    want = expected_trees([0, 1], lambda i: [UIDS[i]])
    rng = random.Random(11)
    for _ in range(8):
        p = subprocess.Popen([sys.executable, "-c", COMPACTOR, str(path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.2))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert stored_trees(path) == want
    s = CacheStore.open(path)
    compact(s)  # a later compaction clears what a killed one left behind
    s.close()
    assert not list(path.glob(".compact-*"))


READER = r"""
import sys, time
from cache_store.store import CacheStore
s = CacheStore.open(sys.argv[1])
txn = s.env.begin()  # a read snapshot that pins pages until it ends
print("reading", flush=True)
time.sleep(60)
"""


def test_reader_slots_of_killed_processes_are_cleared_on_open(tmp_path):
    path = tmp_path / "c"
    holder = CacheStore.open(path)  # keeps the environment in use, so LMDB never resets its lock table
    p = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "reading"
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    dead = f" {p.pid} "
    assert dead in holder.env.readers()  # the dead reader still holds its slot...
    opener = "import sys; from cache_store.store import CacheStore; print(CacheStore.open(sys.argv[1]).env.readers())"
    out = subprocess.run([sys.executable, "-c", opener, str(path)], capture_output=True, text=True, check=True)
    assert dead not in out.stdout  # ...until another process opens the cache (reader_check)
    assert dead not in holder.env.readers()
    holder.close()
