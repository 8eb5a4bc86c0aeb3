"""The sequence store on a real LMDB on disk: append-only commits, per-sequence decay and the
floor, loads that rebuild the tree, and reliability with real processes (SIGKILLed writers,
concurrent writers, flipped bytes)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter

import lmdb
import pytest

from cache_store import seqrecord, store
from cache_store.errors import CorruptRecord, NotACacheError, OldFormatError
from cache_store.seqstore import LmdbSequenceStore, PruneCriteria
from cache_store.store import load_tree
from cache_store.suffix_tree import SuffixTree
from cache_store.uid import prompt_uid
from tests.cache_store.reference_tree import ReferenceTree
from tests.cache_store.support import dir_digest, old_format_cache

UIDS = [prompt_uid([k], "seqstore") for k in range(3)]


def rollout(i: int, n: int = 40) -> list[int]:
    r = random.Random(i)
    return [r.randrange(50) for _ in range(n)]


def stored(path) -> dict[str, Counter]:
    """Every prompt's stored sequences (as a multiset); every record must pass its checksum."""
    s = LmdbSequenceStore.open(path)
    try:
        for uid in UIDS:
            for _k, rec in s.raw_records(uid):
                seqrecord.check(rec)
        return {u: Counter(tuple(x.tokens.tolist()) for x in s.read(u)) for u in UIDS}
    finally:
        s.close()


def expected(indices, targets_of) -> dict[str, Counter]:
    out = {u: Counter() for u in UIDS}
    for i in indices:
        for u in targets_of(i):
            out[u][tuple(rollout(i))] += 1
    return out


# -- semantics ------------------------------------------------------------------------------

def test_a_commit_appends_and_never_rewrites_what_is_stored(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s")
    s.append(UIDS[0], [rollout(0), rollout(1)])
    before = s.raw_records(UIDS[0])
    s.append(UIDS[0], [rollout(2)])
    after = s.raw_records(UIDS[0])
    assert after[:2] == before and len(after) == 3  # the old records are byte-identical
    st = s.stats()
    assert (st.prompts, st.sequences, st.tokens, st.corrupt) == (1, 3, 120, 0)
    s.close()


def test_load_can_keep_only_the_newest_sequences(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "s") as s:
        s.append(UIDS[0], [rollout(i) for i in range(5)])
        tree = load_tree(s, UIDS[0], max_depth=8, newest=2)
        assert tree.stats().sequences == 2
        assert [list(tree.sequence(i)) for i in range(2)] == [rollout(3), rollout(4)]
        assert load_tree(s, UIDS[0], max_depth=8, newest=9).stats().sequences == 5


def test_load_keeps_the_newest_sequences_that_fit_its_token_bound(tmp_path):
    """A load's cost and its tree's memory grow with the tokens it builds, so a prompt with many
    long rollouts stored loads only its newest ones, up to `tokens` (the newest one always)."""
    lengths = [40, 30, 50, 20, 25]
    with LmdbSequenceStore.open(tmp_path / "s") as s:
        s.append(UIDS[0], [rollout(i, n) for i, n in enumerate(lengths)])
        for bound, kept in ((95, [2, 3, 4]), (94, [3, 4]), (45, [3, 4]), (44, [4]), (10, [4]), (10**9, [0, 1, 2, 3, 4])):
            tree = load_tree(s, UIDS[0], max_depth=8, tokens=bound)
            assert [list(tree.sequence(i)) for i in range(tree.stats().sequences)] == \
                [rollout(i, lengths[i]) for i in kept]
        assert load_tree(s, UIDS[0], max_depth=8, newest=1, tokens=10**9).stats().sequences == 1
        # the default bound leaves a whole epoch of long rollouts (16 x 8,192 tokens) in
        assert store.LOAD_TOKENS >= 16 * 8192


def test_a_bounded_read_never_decodes_what_lies_past_its_bound(tmp_path):
    """The walk stops at the bound: a record past it is never even checked (a corrupt one there
    warns only when a read reaches it), so a load costs what it keeps, not what the prompt has
    stored."""
    with LmdbSequenceStore.open(tmp_path / "s") as s:
        s.append(UIDS[0], [rollout(i) for i in range(6)])
        key, rec = s.raw_records(UIDS[0])[0]
        s.put_raw(key, rec[:-1] + bytes([rec[-1] ^ 1]))
        with warnings.catch_warnings():  # the walk reads the header of the first that does not fit (1)
            warnings.simplefilter("error")
            assert [x.tokens.tolist() for x in s.read(UIDS[0], tokens=160)] == [rollout(i) for i in range(2, 6)]
            assert load_tree(s, UIDS[0], max_depth=8, newest=5).stats().sequences == 5
        with pytest.warns(Warning, match="sequence 0 of"):
            assert len(s.read(UIDS[0], tokens=10**9)) == 5


def test_load_builds_the_tree_of_the_decayed_sequences(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s", half_life=1.0, floor=0.1)
    s.append(UIDS[0], [rollout(0), rollout(1)])
    s.tick()
    s.append(UIDS[0], [rollout(2)])
    tree = load_tree(s, UIDS[0], max_depth=8)
    want, ref = SuffixTree(8), ReferenceTree(8)
    for i, w in ((0, 0.5), (1, 0.5), (2, 1.0)):
        want.add(rollout(i), w), ref.add(rollout(i), w)
    for ctx in ([rollout(0)[:k] for k in range(1, 30)] + [rollout(2)[:k] for k in range(1, 30)]):
        assert tree.draft(ctx) == want.draft(ctx) == ref.draft(ctx)
        assert tree.draft_tree(ctx) == ref.draft_tree(ctx)
        assert tree.count(ctx[-8:]) == ref.count(ctx[-8:])
    s.close()


def test_the_floor_drops_whole_sequences_however_often_their_paths_repeat(tmp_path):
    """Per-sequence decay: ten copies of a rollout each fall below the floor together, even
    though their summed weight (the old per-node count) would still be above it."""
    s = LmdbSequenceStore.open(tmp_path / "s", half_life=1.0, floor=0.3)
    s.append(UIDS[0], [rollout(0)] * 10)
    s.tick()
    s.append(UIDS[1], [rollout(1)])
    assert [x.weight for x in s.read(UIDS[0])] == [0.5] * 10
    s.tick()  # weight 0.25 < 0.3 each; 2.5 summed
    assert s.read(UIDS[0]) == [] and load_tree(s, UIDS[0]).nodes == 0
    assert [x.weight for x in s.read(UIDS[1])] == [0.5]
    assert s.prune().sequences == 10
    st = s.stats()
    assert (st.prompts, st.sequences) == (1, 1)
    s.close()


def test_bad_tokens_raise_before_anything_is_written(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s")
    for bad in ([1, -1], [1, 2**31], [[1, 2]]):
        with pytest.raises(ValueError):
            s.append_many({UIDS[0]: [rollout(0)], UIDS[1]: [bad]})
    for uid in ("prompt1", UIDS[0][:-1], UIDS[0].upper()):  # keys are uid + number: one length
        with pytest.raises(ValueError, match="uid"):
            s.append(uid, [rollout(0)])
    assert s.stats().sequences == 0
    s.close()


def test_neither_the_old_tree_cache_nor_a_foreign_lmdb_opens_and_neither_is_touched(tmp_path):
    old = old_format_cache(tmp_path / "trees")
    before = dir_digest(old)
    with pytest.raises(OldFormatError, match="earlier tree format"):
        LmdbSequenceStore.open(old)
    assert dir_digest(old) == before  # untouched
    env = lmdb.open(str(tmp_path / "foreign"))  # someone else's LMDB, its lock file gone
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    (tmp_path / "foreign" / "lock.mdb").unlink()
    with pytest.raises(NotACacheError, match="not an srt cache"):
        LmdbSequenceStore.open(tmp_path / "foreign")
    assert [p.name for p in (tmp_path / "foreign").iterdir()] == ["data.mdb"]  # nothing written


# -- flipped bytes -----------------------------------------------------------------------------

def test_flipped_bytes_are_reported_skipped_and_prunable(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s")
    s.append(UIDS[0], [rollout(0), rollout(1)])
    key, rec = s.raw_records(UIDS[0])[0]
    bad = bytearray(rec)
    bad[len(bad) // 2] ^= 0x04
    s.put_raw(key, bytes(bad))
    assert s.stats().corrupt == 1
    with pytest.warns(UserWarning, match="corrupt"):
        assert [x.tokens.tolist() for x in s.read(UIDS[0])] == [rollout(1)]
    assert s.prune(PruneCriteria(drop_corrupt=True)).corrupt == 1
    st = s.stats()
    assert (st.corrupt, st.sequences) == (0, 1)
    s.close()


def test_every_single_byte_flip_is_caught():
    rec = seqrecord.encode(seqrecord.as_tokens(rollout(3, 200)), 5, 0.5)
    for i in range(len(rec)):
        bad = bytearray(rec)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecord):
            seqrecord.check(bytes(bad))
    head, tokens = seqrecord.decode(rec)
    assert (head.tick, head.weight, tokens.tolist()) == (5, 0.5, rollout(3, 200))


# -- real processes ----------------------------------------------------------------------------

# Appends rollout i to two prompts in ONE transaction (kill mode), or to one prompt; prints
# `begin i` / `done i`. mode "naive" is the wrong variant: it takes the record number in a
# read transaction and writes in a later one, so racing writers overwrite each other.
WRITER = r"""
import random, struct, sys, time
from cache_store.seqenv import META
from cache_store.seqstore import LmdbSequenceStore
from cache_store.record_keys import record_key
from cache_store import seqrecord, seqstore
from cache_store.uid import prompt_uid
path, start, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
UIDS = [prompt_uid([k], "seqstore") for k in range(3)]
def rollout(i):
    r = random.Random(i)
    return [r.randrange(50) for _ in range(40)]
s = LmdbSequenceStore.open(path)
print("ready", flush=True)
if mode != "kill":
    sys.stdin.readline()
for i in range(start, start + n):
    targets = [UIDS[i % 3], UIDS[(i + 1) % 3]] if mode == "kill" else [UIDS[i % 2]]
    print("begin", i, flush=True)
    if mode == "naive":
        uid, e = targets[0], s._e
        nxt = e.read(lambda txn: e.get_meta(txn, uid.encode()))[0]
        time.sleep(0.002)
        rec = seqrecord.encode(seqrecord.as_tokens(rollout(i)), 0, 1.0)
        e.write(lambda txn: (txn.put(record_key(uid, nxt), rec, db=e.dbs["seqs"]),
                             txn.put(uid.encode(), META.pack(nxt + 1, 0, 0, 0.0, 0), db=e.dbs["meta"])))
    else:
        s.append_many({u: [rollout(i)] for u in targets})
    print("done", i, flush=True)
s.close()
"""


def spawn(path, start, n, mode):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(start), str(n), mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkilled_writers_leave_a_sound_store_and_whole_commits(tmp_path):
    path = tmp_path / "s"
    LmdbSequenceStore.open(path).close()
    rng = random.Random(7)
    targets = lambda i: [UIDS[i % 3], UIDS[(i + 1) % 3]]  # noqa: E731
    committed: list[int] = []
    nxt = 0
    for _ in range(16):
        p = spawn(path, nxt, 10**6, "kill")
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.1))
        p.send_signal(signal.SIGKILL)
        p.wait()
        lines = p.stdout.read().split("\n")[:-1]
        p.stdout.close()
        done = [int(x.split()[1]) for x in lines if x.startswith("done")]
        begun = [int(x.split()[1]) for x in lines if x.startswith("begin")]
        inflight = [i for i in begun if i not in done]
        got = stored(path)
        if got == expected(committed + done, targets):
            committed += done
        else:  # the append in flight may have landed: all of it, never half
            assert inflight and got == expected(committed + done + inflight, targets), "lost or torn append"
            committed += done + inflight
        nxt = max(begun, default=nxt - 1) + 1
    assert len(committed) > 16


def _concurrently(path, mode: str, writers: int = 3, each: int = 20) -> list[int]:
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
def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "s"
    LmdbSequenceStore.open(path).close()
    done = _concurrently(path, "append")
    assert len(done) == 60
    assert stored(path) == expected(done, lambda i: [UIDS[i % 2]])
    s = LmdbSequenceStore.open(path)
    assert s.stats().sequences == 60
    s.close()


@pytest.mark.slow
def test_the_checker_catches_a_writer_that_numbers_records_outside_its_transaction(tmp_path):
    path = tmp_path / "s"
    LmdbSequenceStore.open(path).close()
    done = _concurrently(path, "naive")
    got = stored(path)
    assert sum(sum(c.values()) for c in got.values()) < len(done)
