"""Building a tree in one call off the GIL (`SuffixTree.from_sequences`), and moving streams onto
a tree built meanwhile (`SuffixStream.move`): how a prompt's stored tree loads in a thread while
its live samples already stream, then continue in the loaded tree.

A tree whose streams moved onto a rebuilt tree must count and draft exactly like one that held
everything from the start: the random programs of test_suffix_tree, with a "rebuild" step that
builds a new tree from the finished sequences added so far and moves every stream (live and
closed) onto it, must agree with the reference token tree at every check.
"""

from __future__ import annotations

import random
import threading
import time
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_store.suffix_tree import SuffixTree
from tests.cache_store.reference_tree import ReferenceTree
from tests.cache_store.support import first_caught
from tests.cache_store.test_suffix_tree import (
    counts_disagree,
    drafts_disagree,
    op,
    queries,
    streams_disagree,
)


def move_all(tree, streams, new):
    for s, _ in streams:
        s.move(new)


def copy_without_moving(tree, streams, new):
    """Bug: each stream's tokens so far are added to the new tree, but the stream goes on in the old one."""
    for s, _ in streams:
        new.add(tree.sequence(s.sequence_id))


def run(d, ops, qs, move=move_all):
    """Play the program; at each "rebuild" the tree is built anew from the finished sequences
    and the streams moved onto it. None when it agrees with the reference throughout."""
    tree, ref, streams, tails, added = SuffixTree(d), ReferenceTree(d), [], [], []
    extra = [q[0] for q in qs]
    for kind, arg in ops:
        if kind == "add":
            seq, w, times = arg
            for _ in range(times):
                tree.add(seq, w), ref.add(seq, w), added.append((seq, w))
        elif kind == "open":
            streams.append([tree.stream(), True]), tails.append(ref.stream())
        elif kind == "extend" and streams and streams[arg[0] % len(streams)][1]:
            i = arg[0] % len(streams)
            streams[i][0].extend(arg[1]), ref.extend(tails[i], arg[1])
        elif kind == "close" and streams:
            s = streams[arg % len(streams)]
            s[0].close()
            s[1] = False
        elif kind == "rebuild":
            new = SuffixTree.from_sequences(added, d)
            move(tree, streams, new)
            tree = new
        elif kind == "check" and (why := counts_disagree(tree, ref, extra)):
            return "mid-way " + why
    return counts_disagree(tree, ref, extra) or streams_disagree(tree, streams, qs) or drafts_disagree(tree, ref, qs)


rebuild = st.tuples(st.just("rebuild"), st.none())
program = st.tuples(st.integers(2, 9), st.lists(st.one_of(op, rebuild, rebuild), max_size=16), queries)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_streams_moved_onto_a_rebuilt_tree_count_and_draft_as_if_always_there(prog):
    assert run(*prog) is None


def test_random_programs_catch_streams_that_were_copied_instead_of_moved():
    found = first_caught(program, lambda prog: run(*prog, move=copy_without_moving) is not None)
    assert run(*found) is None


def test_a_built_tree_is_the_tree_of_adding_each_sequence():
    rng = random.Random(0)
    seqs = []
    for i in range(30):
        toks = [rng.randrange(5) for _ in range(rng.randrange(0, 90))]
        probs = [rng.random() for _ in toks] if i % 3 else None
        seqs.append((array("i", toks) if i % 2 else toks, rng.choice([0.5, 1.0, 3.0]), probs))
    built, added = SuffixTree.from_sequences(iter(seqs), 12), SuffixTree(12)
    for s in seqs:
        added.add(*s)
    assert built._t._dump() == added._t._dump()
    for i in range(len(seqs)):
        assert built.sequence(i) == added.sequence(i) and built.sequence_probs(i) == added.sequence_probs(i)


def test_a_moved_stream_keeps_its_probabilities_and_goes_on_in_the_new_tree():
    old, new = SuffixTree(8), SuffixTree.from_sequences([([1, 2, 3], 2.0)], 8)
    s = old.stream()
    s.extend([1, 2], [0.5, 0.25])
    s.move(new)
    s.extend([3], [1.0])
    assert new.sequence(s.sequence_id).tolist() == [1, 2, 3] and s.sequence_id == 1
    assert new.sequence_probs(s.sequence_id).tolist() == pytest.approx([0.5, 0.25, 1.0], abs=0.002)
    assert new.count([1, 2, 3]) == 3.0 and new.stats().live == 1
    assert old.count([1, 2]) == 1.0 and old.count([1, 2, 3]) == 0.0 and old.stats().live == 0
    s.close()
    s.move(old)  # a closed stream moves as a finished sequence
    assert old.count([1, 2, 3]) == 1.0 and old.stats().live == 0


def test_bad_moves_and_builds_raise():
    t = SuffixTree(4)
    s = t.stream()
    with pytest.raises(ValueError, match="already"):
        s.move(t)
    with pytest.raises(TypeError):
        s._s.move(object())
    for bad in ([([1, -1], 1.0)], [([1], 0.0)], [([1], 1.0, [2.0])], [(1,)], [5]):
        with pytest.raises((ValueError, TypeError)):
            SuffixTree.from_sequences(bad, 4)


def test_a_build_lets_other_threads_run():
    """The windows go in without the GIL: the main thread keeps running during a build in another
    thread (holding the GIL, it would stall for the whole build)."""
    rng = random.Random(1)
    seqs = [(array("i", (rng.randrange(50) for _ in range(8192))), 1.0) for _ in range(24)]
    start = time.perf_counter()
    SuffixTree.from_sequences(seqs, 64)
    alone = time.perf_counter() - start
    worker = threading.Thread(target=SuffixTree.from_sequences, args=(seqs, 64))
    gap, last = 0.0, time.perf_counter()
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    assert gap < alone / 4, (gap, alone)
