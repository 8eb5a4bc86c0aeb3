"""The operations behind `srt cache` on a real sequence store: refusing what is not one,
prune with each criterion (and its dry run), stats, export, import."""

from __future__ import annotations

import random
import time

import pytest

from cache_store.errors import CacheError, NotACacheError, OldFormatError
from cache_store.locations import export_store, import_store
from cache_store.seqstore import LmdbSequenceStore, PruneCriteria
from cache_store.store import load_tree
from cache_store.uid import prompt_uid
from tests.cache_store.support import dir_digest, foreign_lmdb, old_format_cache

UIDS = [prompt_uid([k], "maintenance") for k in range(4)]


def rollout(i: int, n: int = 30) -> list[int]:
    r = random.Random(i)
    return [r.randrange(40) for _ in range(n)]


def written_in_order(path, order, **settings) -> LmdbSequenceStore:
    """A store whose prompts were last written in `order` (uid indices), two sequences each."""
    s = LmdbSequenceStore.open(path, **settings)
    for k in order:
        s.append(UIDS[k], [rollout(10 * k), rollout(10 * k + 1)])
        time.sleep(0.002)  # distinct last-write times
    return s


def contents(s: LmdbSequenceStore) -> dict[str, list[tuple[int, ...]]]:
    return {u: [tuple(x.tokens.tolist()) for x in s.read(u)] for u in s.uids()}


# -- what is not a sequence store ---------------------------------------------------------

def test_the_old_tree_format_is_refused_with_the_way_on_and_left_untouched(tmp_path):
    old = old_format_cache(tmp_path / "old")
    before = dir_digest(old)
    for kw in ({}, {"readonly": True}, {"create": False}):
        with pytest.raises(OldFormatError) as e:
            LmdbSequenceStore.open(old, **kw)
        assert str(e.value) == (
            f"{old}: a cache of srt's earlier tree format (one trie per prompt), which cannot be "
            "converted exactly into the sequence store; move it aside and rebuild it from your "
            f"steps pools with `srt cache add POOL --cache {old}`")
    s = LmdbSequenceStore.open(tmp_path / "new")
    with pytest.raises(OldFormatError):
        import_store(s, old)
    assert s.stats().sequences == 0
    s.close()
    assert dir_digest(old) == before


def test_a_foreign_lmdb_is_not_a_cache_and_stays_byte_for_byte(tmp_path):
    foreign = foreign_lmdb(tmp_path / "foreign")
    before = dir_digest(foreign)
    assert "lock.mdb" in before  # LMDB's lock file exists and must not be rewritten
    for kw in ({}, {"readonly": True}):
        with pytest.raises(NotACacheError, match="not an srt cache") as e:
            LmdbSequenceStore.open(foreign, **kw)
        assert type(e.value) is NotACacheError
    assert dir_digest(foreign) == before and not (foreign / "srt.lock").exists()


# -- prune --------------------------------------------------------------------------------

def test_max_prompts_evicts_the_least_recently_written_prompts_first(tmp_path):
    s = written_in_order(tmp_path / "s", [0, 1, 2, 3])
    s.append(UIDS[0], [rollout(99)])  # prompt 0 is now the most recently written
    plan = s.prune(PruneCriteria(max_prompts=2))
    assert plan.lru == [UIDS[1], UIDS[2]]
    assert (plan.prompts, plan.sequences, plan.tokens, plan.prompts_after) == (2, 4, 120, 2)
    assert sorted(s.uids()) == sorted([UIDS[0], UIDS[3]])
    assert s.stats().prompts == 2
    s.close()


def test_max_bytes_evicts_until_the_records_fit(tmp_path):
    s = written_in_order(tmp_path / "s", [2, 0, 1])
    sizes = {u: sum(len(v) for _k, v in s.raw_records(u)) for u in UIDS[:3]}
    budget = sizes[UIDS[1]] + sizes[UIDS[0]]  # the two newest fit exactly
    plan = s.prune(PruneCriteria(max_bytes=budget))
    assert plan.lru == [UIDS[2]] and plan.bytes == sizes[UIDS[2]] and plan.bytes_after == budget
    assert s.stats().record_bytes == budget
    s.close()


def test_older_than_drops_prompts_not_written_for_that_long(tmp_path):
    s = written_in_order(tmp_path / "s", [0, 1])
    time.sleep(0.4)
    s.append(UIDS[2], [rollout(5)])
    plan = s.prune(PruneCriteria(older_than=0.3))
    assert sorted(plan.old) == sorted(UIDS[:2]) and plan.sequences == 4
    assert s.uids() == [UIDS[2]]
    s.close()


def test_min_count_drops_sequences_whose_decayed_weight_is_below_it(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s", half_life=1.0, floor=0.01)
    s.append(UIDS[0], [rollout(0)])   # weight 0.25 after two ticks
    s.tick()
    s.append(UIDS[0], [rollout(1)])   # 0.5
    s.append(UIDS[1], [rollout(2)])   # 0.5
    s.tick()
    s.append(UIDS[1], [rollout(3)])   # 1
    plan = s.prune(PruneCriteria(min_count=0.3))
    assert (plan.light, plan.sequences, plan.prompts) == (1, 1, 0)
    assert contents(s) == {UIDS[0]: [tuple(rollout(1))], UIDS[1]: [tuple(rollout(2)), tuple(rollout(3))]}
    assert s.prune(PruneCriteria(min_count=0.6)).prompts == 1  # prompt 0 empties and goes
    assert s.uids() == [UIDS[1]] and s.stats().sequences == 1
    s.close()


def test_a_dry_run_reports_the_plan_and_changes_nothing(tmp_path):
    s = written_in_order(tmp_path / "s", [0, 1, 2])
    key, rec = s.raw_records(UIDS[1])[0]
    s.put_raw(key, rec[:-1] + bytes([rec[-1] ^ 1]))
    crit = PruneCriteria(max_prompts=1, drop_corrupt=True)
    before = dir_digest(s.path)
    dry = s.prune(crit, dry_run=True)
    assert dir_digest(s.path) == before
    assert (dry.corrupt, dry.lru, dry.prompts, dry.sequences) == (1, [UIDS[0], UIDS[1]], 2, 4)
    assert s.prune(crit) == dry
    assert s.uids() == [UIDS[2]] and s.stats().corrupt == 0
    s.close()


def test_appends_after_a_prune_number_on_and_are_kept(tmp_path):
    s = written_in_order(tmp_path / "s", [0, 1])
    s.prune(PruneCriteria(max_prompts=0))
    s.append(UIDS[0], [rollout(7)])
    assert contents(s) == {UIDS[0]: [tuple(rollout(7))]}
    s.close()


# -- stats --------------------------------------------------------------------------------

def test_stats_reports_counts_sizes_the_largest_prompts_and_memory(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s", half_life=50.0, floor=0.2)
    s.append(UIDS[0], [rollout(0, 300), rollout(1, 300)])
    s.append(UIDS[1], [rollout(2, 30)])
    s.tick(3)
    key, rec = s.raw_records(UIDS[1])[0]
    s.put_raw(key, rec[:-1] + bytes([rec[-1] ^ 1]))
    st = s.stats(top=1)
    assert (st.prompts, st.sequences, st.tokens, st.tick, st.half_life, st.floor) == (2, 3, 630, 3, 50.0, 0.2)
    assert (st.corrupt, st.corrupt_uids) == (1, [UIDS[1]])
    assert st.record_bytes == sum(len(v) for u in UIDS[:2] for _k, v in s.raw_records(u))
    assert st.disk_bytes >= st.used_bytes > st.record_bytes
    [big] = st.largest
    assert (big.uid, big.sequences, big.tokens) == (UIDS[0], 2, 600)
    assert big.disk_bytes == sum(len(v) for _k, v in s.raw_records(UIDS[0])) and big.last_write <= time.time()
    tree = load_tree(s, UIDS[0])
    assert st.memory_per_token == tree.memory_bytes() / 600 and st.memory_bytes == round(630 * st.memory_per_token)
    assert s.stats(verify=False).corrupt is None
    s.close()


# -- export and import --------------------------------------------------------------------

def test_export_is_a_compact_store_of_the_same_sequences_and_refuses_a_used_directory(tmp_path):
    s = written_in_order(tmp_path / "s", [0, 1, 2])
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("mine")
    with pytest.raises(CacheError, match="not an empty directory"):
        export_store(s, tmp_path / "used")
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["x"]
    export_store(s, tmp_path / "out")
    copy = LmdbSequenceStore.open(tmp_path / "out", readonly=True)
    assert contents(copy) == contents(s) and copy.info() == s.info()
    copy.close()
    assert not (tmp_path / "out" / "srt.lock").exists()  # a read-only look adds nothing
    s.close()


def test_import_across_half_lives_brings_the_weight_as_it_is_now(tmp_path):
    src = LmdbSequenceStore.open(tmp_path / "src", half_life=2.0, floor=0.3)
    src.append(UIDS[0], [rollout(0)])
    src.tick(2)   # 0.5
    src.append(UIDS[0], [rollout(1)])
    src.tick(2)   # 0.25 (below the floor: not imported) and 0.5
    src.close()
    dst = LmdbSequenceStore.open(tmp_path / "dst", half_life=1.0)
    rep = import_store(dst, tmp_path / "src")
    assert (rep.sequences, rep.below_floor) == (1, 1)
    assert [(x.tokens.tolist(), x.weight, x.tick) for x in dst.read(UIDS[0])] == [(rollout(1), 0.5, 0)]
    dst.close()
