"""The tree session, the one owner of a run's prompt trees and their persistence, on a real LMDB
store: a driver's group is stored whole and in the order its samples started; a sequence nobody
holds is stored when it stops; one commit rule (count, age, batch end, a prompt loaded again,
close); a batch end appends before the clock advances; trees stay while held or live, then among
the idle ones kept."""

from __future__ import annotations

import time

from cache_store.seqstore import LmdbSequenceStore
from srtcli.rollout.tree_session import TreeSession
from srtcli.store_link import StoreLink

U, V = "a" * 32, "b" * 32


def run(session: TreeSession, uid: str, tokens: list[int]) -> object:
    """One sequence of the prompt streamed (anchor 1, then `tokens`); its stream, still live."""
    _, streams = session.start_sequence(uid, 1)
    for s in streams:
        s.extend(tokens)
    return streams[0]


def stored(path, uid: str) -> list[list[int]]:
    with LmdbSequenceStore.open(path, create=False) as store:
        return [list(s.tokens) for s in store.read(uid)]


def test_a_drivers_group_is_stored_whole_in_the_order_its_samples_started(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")))
    session.hold(U)
    a, b, c = run(session, U, [5]), run(session, U, [6]), run(session, U, [7])
    for s in (c, a, b):  # samples finish in any order
        session.stop_sequence(s)
    assert session.waiting == 0  # the group is taken once released
    session.release(U)
    assert session.waiting == 3
    session.close()
    assert stored(tmp_path / "c", U) == [[1, 5], [1, 6], [1, 7]]


def test_a_sequence_still_running_when_its_group_is_released_holds_the_group_back(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")))
    session.hold(U)
    ahead, done = run(session, U, [9]), run(session, U, [5])
    session.stop_sequence(done)
    session.release(U)
    assert session.waiting == 0
    ahead.extend([8])
    session.stop_sequence(ahead)
    assert session.waiting == 2
    session.close()
    assert stored(tmp_path / "c", U) == [[1, 9, 8], [1, 5]]


def test_a_sequence_nobody_holds_is_stored_when_it_stops(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")))
    first, second = run(session, U, [5, 6]), run(session, U, [7])
    session.stop_sequence(second)
    assert session.waiting == 1
    session.commit()
    assert stored(tmp_path / "c", U) == [[1, 7]]
    first.extend([4])
    session.stop_sequence(first)
    session.close()
    assert stored(tmp_path / "c", U) == [[1, 7], [1, 5, 6, 4]]


def test_the_commit_rule_is_a_count_or_an_age(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")), commit_every=2, commit_seconds=3600)
    session.stop_sequence(run(session, U, [5]))
    assert not session.due()
    session.stop_sequence(run(session, V, [6]))
    assert session.due() and session.commit_if_due() and session.waiting == 0
    aged = TreeSession(session.link, commit_every=100, commit_seconds=0.05)
    aged.stop_sequence(run(aged, U, [7]))
    assert not aged.due()
    time.sleep(0.06)
    assert aged.commit_if_due() and aged.waiting == 0
    aged.close()
    assert stored(tmp_path / "c", U) == [[1, 5], [1, 7]]


def test_a_prompt_loaded_again_reads_back_what_it_queued(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")), commit_every=100, commit_seconds=3600)
    session.stop_sequence(run(session, U, [5, 6]))
    assert U not in session.trees.groups and session.waiting == 1  # idle_groups 0: it left memory
    g, _ = session.start_sequence(U, 1)
    assert g.hit and session.waiting == 0 and g.tree.count([5, 6]) == 1
    session.close()


def test_a_batch_end_appends_before_the_clock_advances(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")), commit_every=100, commit_seconds=3600)
    session.stop_sequence(run(session, U, [5]))
    session.end_batch()
    store = session.link.store
    assert store.now() == 1 and [s.tick for s in store.read(U)] == [0]
    session.close()


def test_close_stores_what_every_prompt_still_holds(tmp_path):
    session = TreeSession(StoreLink(LmdbSequenceStore.open(tmp_path / "c")))
    session.hold(V)  # a run-ahead group of a prompt the run never reached
    session.stop_sequence(run(session, V, [3, 4]))
    run(session, U, [5])  # a sequence cut short
    session.close()
    assert stored(tmp_path / "c", V) == [[1, 3, 4]] and stored(tmp_path / "c", U) == [[1, 5]]


def test_a_tree_stays_while_held_or_live_then_among_the_idle_ones_kept():
    session = TreeSession(idle_groups=1)
    session.hold(U)
    live = run(session, V, [5])
    session.release(U)
    assert set(session.trees.groups) == {U, V}  # U idle (kept), V live
    session.stop_sequence(live)
    assert set(session.trees.groups) == {V}  # V idle now: the one kept


def test_a_link_that_does_not_write_neither_appends_nor_ticks(tmp_path):
    store = LmdbSequenceStore.open(tmp_path / "c")
    session = TreeSession(StoreLink(store, writer=False))
    session.stop_sequence(run(session, U, [5]))
    session.end_batch()
    assert store.now() == 0 and store.read(U) == []
    session.close()
