"""CacheStore on a real LMDB on disk: uids, records, merge-not-overwrite, lazy decay, LRU
bookkeeping, map growth, refusing foreign caches, prune, compaction, export/import."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import warnings

import lmdb
import pytest

from cache_store.codec import MetaRecord, check_record, decode_record, encode_record
from cache_store.errors import (
    CacheBusyError, CorruptRecord, CorruptTreeWarning, FormatVersionError, NotACacheError,
)
from cache_store.prune import PruneCriteria, apply_prune, plan_prune
from cache_store.store import CacheStore
from cache_store.transfer import compact, export, import_cache
from cache_store.trie import TokenTree
from cache_store.uid import is_uid, prompt_uid

U1, U2, U3 = (prompt_uid([i, i + 1], "test-tok") for i in range(3))


def tree_of(*seqs: list[int]) -> TokenTree:
    t = TokenTree(max_depth=8)
    for s in seqs:
        t.insert(s)
    return t


def same(a: TokenTree | None, b: TokenTree) -> bool:
    return a is not None and a.to_bytes() == b.to_bytes()


@pytest.fixture
def store(tmp_path):
    s = CacheStore.open(tmp_path / "c")
    yield s
    s.close()


# -- uids and records -----------------------------------------------------------------


def test_uid_separates_tokenizers_and_prompts():
    a = prompt_uid([1, 2, 3], "tok-a")
    assert is_uid(a) and a == prompt_uid([1, 2, 3], "tok-a")
    assert a != prompt_uid([1, 2, 3], "tok-b")
    assert a != prompt_uid([1, 2, 4], "tok-a")
    # the fingerprint length is hashed, so moving bytes between the two parts changes the uid
    assert prompt_uid([], "ab") != prompt_uid([0x62], "a")
    for bad in ([-1], [2**32]):
        with pytest.raises(ValueError):
            prompt_uid(bad, "t")
    with pytest.raises(ValueError):
        prompt_uid([1], "")


def test_record_roundtrip_and_every_byte_is_checked():
    table = tree_of([1, 2, 3, 1, 2, 4]).to_bytes()
    rec = encode_record(table, stamp=42)
    assert decode_record(rec) == (42, table)
    for i in range(len(rec)):  # flip each byte in turn: the header, the CRC or the payload
        bad = bytearray(rec)
        bad[i] ^= 0x10
        with pytest.raises(CorruptRecord):
            decode_record(bytes(bad))
    with pytest.raises(CorruptRecord):
        check_record(rec[:-1])
    m = MetaRecord(1.5, 2, 3, 4, 5, 6, 7.25)
    assert MetaRecord.unpack(m.pack()) == m
    with pytest.raises(CorruptRecord):
        MetaRecord.unpack(m.pack()[:-1] + b"\x00")


# -- load / commit / merge ------------------------------------------------------------


def test_commit_merges_and_load_roundtrips(store):
    assert store.load(U1) is None
    d1, d2 = tree_of([1, 2, 3]), tree_of([1, 2, 4], [5])
    before = d1.to_bytes()
    store.commit(U1, d1)
    assert d1.to_bytes() == before  # the delta is not modified
    assert same(store.load(U1), d1)
    store.commit_many({U1: d2, U2: d2})
    assert same(store.load(U1), tree_of([1, 2, 3], [1, 2, 4], [5]))
    assert same(store.load(U2), d2)
    assert store.load(U3) is None


def test_interleaved_writers_lose_nothing_and_blind_overwrite_would(tmp_path):
    """Two writers load the same tree, then both write. Merge keeps both deltas; a blind
    write of `loaded + delta` (the wrong variant) loses the other writer's counts."""
    a = CacheStore.open(tmp_path / "c")
    a.commit(U1, tree_of([9, 9]))
    stale = a.load(U1)          # writer A loads
    a.commit(U1, tree_of([1, 2]))  # writer B commits meanwhile
    stale.merge(tree_of([3, 4]))   # A's own work
    expected = tree_of([9, 9], [1, 2], [3, 4])

    a.commit(U2, tree_of([9, 9]))
    a.commit(U2, tree_of([1, 2]))
    a.commit(U2, tree_of([3, 4]))  # A commits only its delta: correct
    assert same(a.load(U2), expected)

    def blind(txn):  # the wrong variant: overwrite with what A loaded plus its delta
        a.put_tree(txn, U1.encode(), stale, a.now(), time.time())

    from cache_store import env as envmod

    envmod.write(a.handle(), blind)
    assert not same(a.load(U1), expected)  # B's [1, 2] is gone
    a.close()


class RacedStore(CacheStore):
    """A store in which another writer commits right after this one merged against its
    snapshot (between the lock-free merge and the write transaction): the real code path,
    with the race placed exactly where it hurts."""

    rival: CacheStore | None = None

    def _prepare(self, uid, delta, old, info):
        out = super()._prepare(uid, delta, old, info)
        rival, self.rival = self.rival, None
        if rival is not None:
            rival.commit(uid, tree_of([6, 6, 6]))
            rival.tick()  # and the clock moves too
        return out


def test_a_commit_racing_between_merge_and_write_is_merged_again(tmp_path):
    s = RacedStore.open(tmp_path / "c", half_life=1.0, floor=0.0)
    s.commit(U1, tree_of([1, 2]))
    s.rival = CacheStore.open(tmp_path / "c")
    s.commit(U1, tree_of([3]))
    t = s.load(U1)
    # [1,2] was stamped at tick 0, [6,6,6] at tick 0, the clock is now 1: both halve; [3] is new
    assert t.count([1, 2]) == 0.5 and t.count([6, 6, 6]) == 0.5 and t.count([3]) == 1.0
    s.close()


def test_corrupt_record_warns_loads_none_and_commit_replaces_it(store):
    store.commit(U1, tree_of([1, 2, 3]))
    rec = bytearray(store.raw_record(U1))
    rec[-3] ^= 0xFF
    with store.env.begin(write=True) as txn:
        txn.put(U1.encode(), bytes(rec), db=store.handle().dbs["trees"])
    with pytest.warns(CorruptTreeWarning, match=U1):
        assert store.load(U1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per uid: the second load is silent
        assert store.load(U1) is None
    store.commit(U1, tree_of([7, 8]))
    assert same(store.load(U1), tree_of([7, 8]))


# -- decay ----------------------------------------------------------------------------


def test_decay_is_lazy_exact_and_floored(tmp_path):
    s = CacheStore.open(tmp_path / "c", half_life=2.0, floor=0.3)
    s.commit(U1, tree_of([1, 2], [1, 2], [1, 2], [1, 2], [1, 3]))  # 1:5, 1-2:4, 1-3:1
    raw = s.raw_record(U1)
    assert s.tick() == 1 and s.tick(1) == 2
    assert s.raw_record(U1) == raw  # ticking touched no tree: decay is lazy
    t = s.load(U1)
    assert t.count([1]) == 2.5 and t.count([1, 2]) == 2.0 and t.count([1, 3]) == 0.5
    s.tick(2)  # 4 ticks = 2 half-lives: 1-3 falls to 0.25 < floor and disappears
    t = s.load(U1)
    assert t.count([1, 2]) == 1.0 and t.count([1, 3]) == 0.0
    s.commit(U1, tree_of([1, 2]))  # merge = decayed old + delta, stamped now
    assert decode_record(s.raw_record(U1))[0] == 4
    assert s.load(U1).count([1, 2]) == 2.0
    s.close()
    with pytest.raises(ValueError):
        CacheStore.open(tmp_path / "d", half_life=0)


def test_settings_are_fixed_at_creation(tmp_path):
    CacheStore.open(tmp_path / "c", half_life=7.0, floor=0.5).close()
    s = CacheStore.open(tmp_path / "c", half_life=99.0)
    assert s.info()["half_life"] == 7.0 and s.info()["floor"] == 0.5
    s.close()


# -- environment rules ----------------------------------------------------------------


def test_one_environment_per_path_per_process(tmp_path):
    a = CacheStore.open(tmp_path / "c")
    b = CacheStore.open(tmp_path / "c")
    assert a.env is b.env
    a.close()
    b.commit(U1, tree_of([1]))  # still open for b
    b.close()
    with pytest.raises(Exception):
        b.commit(U1, tree_of([1]))


def test_map_full_grows_instead_of_failing(tmp_path):
    s = CacheStore.open(tmp_path / "c", map_size=256 * 1024)
    start = s.env.info()["map_size"]
    import random

    rng = random.Random(0)
    for i in range(12):  # ~100 KB of poorly compressible trees each
        s.commit(prompt_uid([i], "t"), tree_of([rng.randrange(1 << 30) for _ in range(600)]))
    assert s.env.info()["map_size"] > start
    assert s.load(prompt_uid([11], "t")).nodes > 0
    s.close()


def test_refuses_what_is_not_a_cache(tmp_path):
    with pytest.raises(NotACacheError, match="no such cache"):
        CacheStore.open(tmp_path / "missing", create=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotACacheError, match="not a directory"):
        CacheStore.open(tmp_path / "file")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(NotACacheError, match="not an srt cache"):
        CacheStore.open(other)  # never initialise a cache over someone's files
    assert os.listdir(other) == ["notes.txt"]
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(b"\x01" * 8192)
    with pytest.raises(NotACacheError):
        CacheStore.open(garbage)
    foreign = tmp_path / "foreign"
    env = lmdb.open(str(foreign), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    with pytest.raises(NotACacheError, match="foreign"):
        CacheStore.open(foreign)


def test_refuses_a_newer_format(tmp_path):
    CacheStore.open(tmp_path / "c").close()
    env = lmdb.open(str(tmp_path / "c"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"version", b"2", db=env.open_db(b"info", txn=txn))
    env.close()
    for _ in range(2):  # a refused open leaves nothing half-open behind in this process
        with pytest.raises(FormatVersionError, match="newer"):
            CacheStore.open(tmp_path / "c")


def test_a_forked_child_opens_its_own_environment(tmp_path):
    s = CacheStore.open(tmp_path / "c")
    s.commit(U1, tree_of([1, 2]))
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's handle
        code = 1
        try:
            c = CacheStore.open(tmp_path / "c")
            code = 0 if (c.env is not s.env and c.load(U1) is not None) else 2
            c.commit(U2, tree_of([3]))
            c.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert same(s.load(U2), tree_of([3]))
    s.close()


# -- LRU bookkeeping and prune ----------------------------------------------------------


def _meta(store, uid):
    with store.env.begin() as txn:
        return MetaRecord.unpack(txn.get(uid.encode(), db=store.handle().dbs["meta"]))


def test_loads_record_access_times_for_lru(tmp_path):
    s = CacheStore.open(tmp_path / "c")
    for u in (U1, U2, U3):
        s.commit(u, tree_of([1, 2, 3]))
    first = _meta(s, U1).access_wall
    time.sleep(0.01)
    s.tick()
    s.load(U1)  # only remembered; written with the next commit/tick/close
    s.close()
    s = CacheStore.open(tmp_path / "c")
    assert _meta(s, U1).access_wall > first and _meta(s, U1).access_tick == 1
    plan = plan_prune(s, PruneCriteria(max_trees=1))
    assert plan.lru == [U2, U3] or plan.lru == [U3, U2]  # U1 was used last
    assert plan.trees_after == 1
    apply_prune(s, PruneCriteria(max_trees=1), plan)
    assert s.load(U1) is not None and s.load(U2) is None and s.load(U3) is None
    s.close()


def test_prune_by_bytes_age_and_min_count(store):
    for i, u in enumerate((U1, U2, U3)):
        store.commit(u, tree_of(*[[1, 2, 3 + j] for j in range(5 * (i + 1))]))
    plan = plan_prune(store, PruneCriteria(max_bytes=0))
    assert len(plan.lru) == 3 and plan.bytes_after == 0
    assert plan_prune(store, PruneCriteria(older_than=3600)).old == []
    assert len(plan_prune(store, PruneCriteria(older_than=60), wall_now=time.time() + 120).old) == 3
    # min-count: [1,2,x] leaves have count 1 and go; [1] and [1,2] stay
    crit = PruneCriteria(min_count=2)
    plan = plan_prune(store, crit)
    assert plan.nodes_trimmed > 0 and not plan.trimmed_empty
    raw = store.raw_record(U1)
    assert store.raw_record(U1) == raw  # planning changed nothing
    apply_prune(store, crit, plan)
    t = store.load(U3)
    assert t.count([1, 2]) == 15 and t.count([1, 2, 3]) == 0
    emptied = plan_prune(store, PruneCriteria(min_count=1000))
    assert sorted(emptied.trimmed_empty) == sorted([U1, U2, U3])


def test_prune_drops_corrupt_records_only_when_asked(store):
    store.commit(U1, tree_of([1]))
    store.commit(U2, tree_of([2]))
    with store.env.begin(write=True) as txn:
        txn.put(U1.encode(), b"garbage", db=store.handle().dbs["trees"])
    assert plan_prune(store, PruneCriteria(max_trees=5)).corrupt == []
    crit = PruneCriteria(drop_corrupt=True)
    plan = plan_prune(store, crit)
    assert plan.corrupt == [U1]
    apply_prune(store, crit, plan)
    assert store.raw_record(U1) is None and store.load(U2) is not None


# -- compaction, export, import -----------------------------------------------------------


def test_compact_shrinks_the_file_and_keeps_the_data(tmp_path):
    s = CacheStore.open(tmp_path / "c")
    uids = [prompt_uid([i], "t") for i in range(200)]
    s.commit_many({u: tree_of(list(range(i, i + 40))) for i, u in enumerate(uids)})
    s.delete_many(uids[1:])
    before, after = compact(s)
    assert after < before / 3
    assert same(s.load(uids[0]), tree_of(list(range(0, 40))))
    s.commit(U1, tree_of([5]))  # still writable after the swap
    s.close()
    assert not list((tmp_path / "c").glob(".compact-*"))


def test_compact_refuses_while_another_process_uses_the_cache(tmp_path):
    s = CacheStore.open(tmp_path / "c")
    s.commit(U1, tree_of([1]))
    code = (
        "import sys, time; from cache_store.store import CacheStore; "
        f"s = CacheStore.open({str(tmp_path / 'c')!r}); print('open', flush=True); time.sleep(30)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "open"
        with pytest.raises(CacheBusyError, match="another process"):
            compact(s)
        s.commit(U2, tree_of([2]))  # the failed attempt left this process a normal user
    finally:
        p.kill()
        p.wait()
    compact(s)  # now alone
    assert same(s.load(U2), tree_of([2]))
    s.close()


def test_export_then_import_twice_doubles_counts(tmp_path):
    src = CacheStore.open(tmp_path / "src", half_life=1.0, floor=0.0)
    src.commit(U1, tree_of([1, 2], [1, 2]))
    src.tick()  # the source's own clock: its counts halve before export/import
    export(src, tmp_path / "exp")
    with pytest.raises(Exception):
        export(src, tmp_path / "exp")  # never over an existing export
    src.close()
    dst = CacheStore.open(tmp_path / "dst")
    dst.commit(U1, tree_of([1, 2]))
    r = import_cache(dst, tmp_path / "exp")
    assert (r.trees, r.new, r.tokens) == (1, 0, 2.0)
    assert dst.load(U1).count([1, 2]) == 2.0  # 1 own + 2 * 0.5 imported
    import_cache(dst, tmp_path / "exp")
    assert dst.load(U1).count([1, 2]) == 3.0  # importing again adds again (documented)
    with pytest.raises(Exception, match="itself"):
        import_cache(dst, tmp_path / "dst")
    dst.close()
    assert not (tmp_path / "exp" / "srt.lock").exists()  # reading an export adds no lock file


def test_info_is_stored_little_endian(tmp_path):
    s = CacheStore.open(tmp_path / "c")
    s.tick(3)
    with s.env.begin() as txn:
        assert struct.unpack("<Q", txn.get(b"tick", db=s.handle().dbs["info"]))[0] == 3
    s.close()


def dir_digest(d) -> dict[str, bytes]:
    """Every name in a directory with its bytes (LMDB's lock file included)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_refused_foreign_lmdb_is_left_byte_for_byte_as_it_was(tmp_path):
    foreign = tmp_path / "foreign"
    env = lmdb.open(str(foreign), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
        txn.put(b"a", b"b", db=env.open_db(b"info", txn=txn))  # even a sub-database named like ours
    env.close()
    before = dir_digest(foreign)
    assert set(before) == {"data.mdb", "lock.mdb"}
    for kw in ({}, {"create": False}, {"readonly": True}):
        with pytest.raises(NotACacheError, match="foreign"):
            CacheStore.open(foreign, **kw)
        assert dir_digest(foreign) == before
    # an srt cache no srt process has written to (a copied data.mdb) still opens
    CacheStore.open(tmp_path / "c").close()
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "data.mdb").write_bytes((tmp_path / "c" / "data.mdb").read_bytes())
    CacheStore.open(copy).close()
