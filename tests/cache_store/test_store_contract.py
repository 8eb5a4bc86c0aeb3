"""The store contract: what every sequence-store backend does, run on each of them (LMDB in a
directory, a Redis server under a prefix of its own), and where it matters compared between
them: the same record bytes, the same prune plans."""

from __future__ import annotations

import random
import re
import time
import warnings

import numpy as np
import pytest

from cache_store import seqrecord
from cache_store.errors import CacheError
from cache_store.locations import export_store, import_store, open_store
from cache_store.redis_store import RedisSequenceStore
from cache_store.seqprune import PruneCriteria
from cache_store.seqstore import LmdbSequenceStore
from cache_store.record_keys import key_number, key_uid, record_key
from cache_store.store import SequenceStore, is_server_url, load_tree
from cache_store.uid import prompt_uid
from tests.cache_store.redis_server import unique_prefix

UIDS = [prompt_uid([k], "contract") for k in range(4)]


def rollout(i: int, n: int = 40) -> list[int]:
    r = random.Random(i)
    return [r.randrange(50) for _ in range(n)]


@pytest.fixture(params=["lmdb", "redis"])
def make(request, tmp_path):
    """A factory of fresh stores of one backend (settings as `open` takes them)."""
    opened = []

    def open_store(**settings):
        if request.param == "lmdb":
            s = LmdbSequenceStore.open(tmp_path / f"s{len(opened)}", **settings)
        else:
            s = RedisSequenceStore.open(request.getfixturevalue("redis_server").url(unique_prefix()), **settings)
        opened.append(s)
        return s

    yield open_store
    for s in opened:
        s.close()


def both(tmp_path, redis_server, **settings) -> tuple[LmdbSequenceStore, RedisSequenceStore]:
    return (LmdbSequenceStore.open(tmp_path / "lmdb", **settings),
            RedisSequenceStore.open(redis_server.url(unique_prefix()), **settings))


def plain(seqs) -> list[tuple]:
    return [(x.tokens.tolist(), x.tick, x.weight) for x in seqs]


def flipped(rec: bytes) -> bytes:
    bad = bytearray(rec)
    bad[len(bad) // 2] ^= 0x04
    return bytes(bad)


# -- appends and reads ----------------------------------------------------------------------

def test_appends_read_back_with_their_probabilities(make):
    s = make()
    assert s.uids() == [] and s.read(UIDS[0]) == []
    p = [0.25, 1.0, float("nan"), 0.0]
    s.append_many({UIDS[0]: [rollout(0, 4), rollout(1), []], UIDS[1]: [rollout(2)]}, probs={UIDS[0]: [p, None, None]})
    got = s.read(UIDS[0])
    assert plain(got) == [(rollout(0, 4), 0, 1.0), (rollout(1), 0, 1.0)]  # the empty one skipped
    assert np.allclose(got[0].probs, p, atol=0.002, equal_nan=True) and got[1].probs is None
    assert s.uids() == sorted(UIDS[:2])
    for bad in ({UIDS[2]: [rollout(3)], UIDS[3]: [[1, -1]]}, {UIDS[2]: [[2**31]]}, {"prompt": [rollout(3)]}):
        with pytest.raises(ValueError):
            s.append_many(bad)
    with pytest.raises(ValueError, match="probs"):
        s.append_many({UIDS[2]: [rollout(3, 3)]}, probs={UIDS[2]: [[0.5, 2.0, 0.5]]})
    assert s.uids() == sorted(UIDS[:2]) and s.stats().sequences == 3  # nothing of a refused batch


def test_the_clock_and_the_header(make):
    s = make(half_life=7.0, floor=0.25)
    assert s.now() == 0 and s.tick() == 1 and s.tick(4) == 5 and s.now() == 5
    with pytest.raises(ValueError, match="never goes back"):
        s.tick(-1)
    info = s.info()
    assert (info["tick"], info["half_life"], info["floor"]) == (5, 7.0, 0.25)
    assert abs(info["created"] - time.time()) < 60


def test_both_backends_store_the_same_record_bytes(tmp_path, redis_server):
    stores = both(tmp_path, redis_server)
    for s in stores:
        s.append_many({UIDS[0]: [rollout(0), rollout(1)], UIDS[1]: [rollout(2)]},
                      probs={UIDS[0]: [[0.5] * 40, None]})
        s.tick(3)
        s.append(UIDS[0], [rollout(3, 7)])
    lm, rd = stores
    for uid in UIDS:
        assert rd.raw_records(uid) == lm.raw_records(uid)
    assert len(lm.raw_records(UIDS[0])) == 3 and rd.uids() == lm.uids()
    for s in stores:
        s.close()


def _newest_of(seqs, newest, tokens):
    """The bounded read's rule applied to the whole read."""
    kept, total = [], 0
    for x in reversed(seqs):
        if len(kept) >= newest or (kept and total + len(x.tokens) > tokens):
            break
        kept.append(x)
        total += len(x.tokens)
    return kept[::-1]


def test_bounded_reads_keep_the_newest_that_fit(make):
    """Records of random lengths, ticks and weights (some below the floor, some corrupt), read
    with random bounds: the newest-first walk keeps what the whole read's newest would be."""
    r = random.Random(0)
    s = make(half_life=1.0, floor=0.2)
    s.tick(3)
    for uid in UIDS:
        s.append(uid, [rollout(r.randrange(10**6), r.randrange(1, 60)) for _ in range(r.randrange(1, 30))])
    for uid in UIDS:
        for key, rec in s.raw_records(uid):
            roll = r.random()
            if roll < 0.3:
                s.put_raw(key, seqrecord.restamp(rec, r.randrange(4), r.choice([0.5, 1.0, 4.0])))
            elif roll < 0.4:
                s.put_raw(key, flipped(rec))
    with pytest.warns(Warning):
        whole = {uid: s.read(uid) for uid in UIDS}
    for _ in range(150):
        uid, newest, tokens = r.choice(UIDS), r.randrange(1, 30), r.randrange(1, 800)
        assert plain(s.read(uid, newest, tokens)) == plain(_newest_of(whole[uid], newest, tokens))
        assert plain(s.read(uid, tokens=tokens)) == plain(_newest_of(whole[uid], 10**9, tokens))
        assert plain(s.read(uid, newest=newest)) == plain(whole[uid][-newest:])
    assert s.read(UIDS[0], newest=0) == []


def test_the_newest_sequence_loads_whatever_its_length(make):
    lengths = [40, 30, 50, 20, 25]
    s = make()
    s.append(UIDS[0], [rollout(i, n) for i, n in enumerate(lengths)])
    for bound, kept in ((95, [2, 3, 4]), (94, [3, 4]), (45, [3, 4]), (44, [4]), (10, [4]), (10**9, [0, 1, 2, 3, 4])):
        assert [x.tokens.tolist() for x in s.read(UIDS[0], tokens=bound)] == [rollout(i, lengths[i]) for i in kept]
    assert [x.tokens.tolist() for x in s.read(UIDS[0], newest=2)] == [rollout(3, 20), rollout(4, 25)]
    tree = load_tree(s, UIDS[0], max_depth=8, newest=1, tokens=10**9)
    assert [list(tree.sequence(0))] == [rollout(4, 25)]


def test_decay_and_the_floor_per_sequence(make):
    s = make(half_life=1.0, floor=0.3)
    s.append(UIDS[0], [rollout(0)] * 10)
    s.tick()
    s.append(UIDS[1], [rollout(1)])
    assert [x.weight for x in s.read(UIDS[0])] == [0.5] * 10
    s.tick()  # 0.25 each, below 0.3, although 2.5 summed
    assert s.read(UIDS[0]) == [] and load_tree(s, UIDS[0]).nodes == 0
    assert plain(s.read(UIDS[1])) == [(rollout(1), 1, 0.5)]
    assert s.prune().sequences == 10
    st = s.stats()
    assert (st.prompts, st.sequences, s.uids()) == (1, 1, [UIDS[1]])


def test_corrupt_records_warn_once_are_skipped_counted_and_prunable(make):
    s = make()
    s.append(UIDS[0], [rollout(0), rollout(1)])
    key, rec = s.raw_records(UIDS[0])[0]
    s.put_raw(key, flipped(rec))
    st = s.stats()
    assert (st.corrupt, st.corrupt_uids, s.stats(verify=False).corrupt) == (1, [UIDS[0]], None)
    with pytest.warns(UserWarning, match=re.escape(f"{s.path}: sequence 0 of {UIDS[0]} is corrupt")):
        assert [x.tokens.tolist() for x in s.read(UIDS[0])] == [rollout(1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per record
        assert [x.tokens.tolist() for x in s.read(UIDS[0])] == [rollout(1)]
    assert s.prune(PruneCriteria(drop_corrupt=True), dry_run=True).corrupt == 1
    assert s.prune(PruneCriteria(drop_corrupt=True)).corrupt == 1
    st = s.stats()
    assert (st.corrupt, st.sequences, st.tokens) == (0, 1, 40)


def test_stats_count_what_is_stored(make):
    s = make(half_life=50.0, floor=0.05)
    s.append_many({UIDS[0]: [rollout(0), rollout(1)], UIDS[1]: [rollout(2, 10)]})
    s.tick(2)
    st = s.stats(top=1)
    record_bytes = sum(len(v) for u in UIDS for _, v in s.raw_records(u))
    assert (st.prompts, st.sequences, st.tokens, st.record_bytes) == (2, 3, 90, record_bytes)
    assert (st.tick, st.half_life, st.floor, st.corrupt) == (2, 50.0, 0.05, 0)
    assert [p.uid for p in st.largest] == [UIDS[0]] and st.largest[0].sequences == 2
    assert st.memory_bytes > 0 and st.disk_bytes > 0 and st.oldest_write <= st.newest_write
    assert st.path == str(s.path)


# -- prune: the same plans on both backends ----------------------------------------------------

CRITERIA = {
    "floor": PruneCriteria(),
    "min_count": PruneCriteria(min_count=0.6),
    "drop_corrupt": PruneCriteria(drop_corrupt=True),
    "older_than": PruneCriteria(older_than=3600),
    "max_trees": PruneCriteria(max_prompts=2),
    "max_bytes": PruneCriteria(max_bytes=1000),
    "all": PruneCriteria(max_prompts=1, min_count=0.3, drop_corrupt=True, older_than=7200),
}


def _fill(s, now: float) -> None:
    """Records of several ticks and weights, last writes hours apart, one corrupt record."""
    r = random.Random(1)
    s.tick(4)
    batch, walls = {}, {}
    for k, uid in enumerate(UIDS):
        batch[uid] = [seqrecord.encode(seqrecord.as_tokens(rollout(10 * k + j, r.randrange(5, 60))),
                                       r.randrange(5), r.choice([0.2, 0.5, 1.0]))
                      for j in range(k + 3)]
        walls[uid] = now - 3000.0 * k
    s.append_raw(batch, walls)
    key, rec = s.raw_records(UIDS[1])[1]
    s.put_raw(key, flipped(rec))


@pytest.mark.parametrize("name", list(CRITERIA))
def test_prune_plans_the_same_on_both_backends_and_does_what_it_planned(tmp_path, redis_server, name):
    now = time.time()
    stores = both(tmp_path, redis_server, half_life=1.0, floor=0.1)
    plans = []
    for s in stores:
        _fill(s, now)
        dry = s.prune(CRITERIA[name], dry_run=True)
        assert s.prune(CRITERIA[name], dry_run=True) == dry  # a dry run changes nothing
        done = s.prune(CRITERIA[name])
        assert done == dry
        plans.append(done)
    lm, rd = stores
    assert plans[0] == plans[1] and plans[0].sequences > 0
    assert rd.uids() == lm.uids()
    for uid in UIDS:
        assert rd.raw_records(uid) == lm.raw_records(uid)
    st_l, st_r = lm.stats(), rd.stats()
    assert (st_r.prompts, st_r.sequences, st_r.tokens, st_r.record_bytes, st_r.corrupt) == \
        (st_l.prompts, st_l.sequences, st_l.tokens, st_l.record_bytes, st_l.corrupt)
    for s in stores:
        s.close()


def test_appends_after_a_prune_number_on(make):
    s = make()
    s.append(UIDS[0], [rollout(0), rollout(1)])
    s.prune(PruneCriteria(max_prompts=0))
    assert s.uids() == [] and s.stats().prompts == 0
    s.append(UIDS[0], [rollout(2)])
    assert [x.tokens.tolist() for x in s.read(UIDS[0])] == [rollout(2)] and s.uids() == [UIDS[0]]


# -- moving records between stores ----------------------------------------------------------

def test_import_keeps_each_sequences_age_and_weight(make, tmp_path):
    src = LmdbSequenceStore.open(tmp_path / "src", half_life=1.0, floor=0.1)
    src.append(UIDS[0], [rollout(0)])
    src.tick(2)
    src.append(UIDS[0], [rollout(1)])
    src.append(UIDS[1], [rollout(2)])
    src.tick()
    dst = make(half_life=1.0, floor=0.1)
    dst.tick(5)
    dst.append(UIDS[0], [rollout(3)])
    rep = import_store(dst, src)
    assert (rep.prompts, rep.sequences, rep.tokens, rep.below_floor) == (2, 3, 120, 0)
    weights = lambda u: sorted((tuple(x.tokens.tolist()), x.weight) for x in dst.read(u))  # noqa: E731
    assert weights(UIDS[0]) == sorted([(tuple(rollout(3)), 1.0), (tuple(rollout(0)), 0.125), (tuple(rollout(1)), 0.5)])
    assert import_store(dst, src).sequences == 3  # a merge appends, not a sync
    src.close()


def test_a_copy_goes_only_into_an_empty_store(make, tmp_path):
    src = LmdbSequenceStore.open(tmp_path / "src")
    src.append(UIDS[0], [rollout(0)])
    dst = make()
    dst.append(UIDS[1], [rollout(1)])
    with pytest.raises(CacheError, match="not empty"):
        export_store(src, dst)
    fresh = make()
    assert export_store(src, fresh) == sum(len(v) for _, v in src.raw_records(UIDS[0]))
    assert fresh.raw_records(UIDS[0]) == src.raw_records(UIDS[0]) and fresh.info() == src.info()
    src.close()


# -- one interface, one opener, one key codec ---------------------------------------------

def test_one_opener_tells_a_server_url_from_a_directory(tmp_path, redis_server):
    with open_store(tmp_path / "d") as d, open_store(redis_server.url(unique_prefix())) as r:
        assert isinstance(d, LmdbSequenceStore) and isinstance(r, RedisSequenceStore)
        assert isinstance(d, SequenceStore) and isinstance(r, SequenceStore)
    assert is_server_url("redis://h:1/0") and is_server_url("rediss://h:1/0")
    for directory in (str(tmp_path / "redis"), tmp_path / "d", "redis:/x", "http://h/0"):
        assert not is_server_url(directory)


def test_record_keys_sort_a_prompts_records_in_append_order_and_decode_back():
    numbers = [0, 1, 255, 256, 70_000, 2**32 - 1]
    keys = [record_key(UIDS[0], n) for n in numbers]
    assert sorted(keys) == keys  # a cursor walks a prompt's records in append order
    assert [(key_uid(k), key_number(k)) for k in keys] == [(UIDS[0], n) for n in numbers]
    assert all(k.startswith(UIDS[0].encode()) and len(k) == 36 for k in keys)
