"""The run-wide tree's rebuild on long runs (`PromptTrees.bound_shared`): past its bound it starts
again from its newest sequences. With `load_steps` (the vLLM proposer) that build runs off the
step, and `adopt` swaps it in `SHARED_REBUILD_STEPS` steps later: never in the step that
crossed the bound, the newest sequences as they were then, and the groups of the steps between
still stream into the old tree. A build that fails is logged and the old tree keeps drafting."""

from __future__ import annotations

import logging

import pytest

import srtcli.rollout.drafters.prompt_trees as prompt_trees
from cache_store.suffix_tree import SuffixTree
from srtcli.rollout.tree_session import TreeSession

LOAD_STEPS, REBUILD_STEPS = 2, 3


def finish_group(session: TreeSession, i: int) -> list[int]:
    """One step of a run: a prompt's one sequence streams 30 tokens and ends; its sequence."""
    session.step()
    out = [(i * 7 + k * 13) % 200 + 3 for k in range(30)]
    _, streams = session.start_sequence(str(i), 2)
    for s in streams:
        s.extend(out)
        s.close()
    session.stop_sequence(streams[0])
    return [2] + out  # anchor first


def contents(tree: SuffixTree) -> list:
    return [list(tree.sequence(j)) for j in range(tree.sequences)]


@pytest.fixture(autouse=True)
def small_bound(monkeypatch):
    monkeypatch.setattr(prompt_trees, "SHARED_MAX_TOKENS", 500)
    monkeypatch.setattr(prompt_trees, "SHARED_KEEP", 100)  # 3 sequences of 31 tokens
    monkeypatch.setattr(prompt_trees, "SHARED_REBUILD_STEPS", REBUILD_STEPS)


@pytest.mark.parametrize("load_steps", [0, LOAD_STEPS])
def test_the_rebuilt_tree_holds_the_newest_sequences_at_the_crossing(load_steps):
    session, streamed, crossings = TreeSession(load_steps=load_steps), [], 0
    trees = session.trees
    i = 0
    while i < 80:
        before = trees.shared
        streamed.append(finish_group(session, i))
        i += 1
        if before.tokens <= 500:  # within the bound (this step's tokens in)
            assert trees.shared is before and trees.shared_next is None
            continue
        crossings += 1
        newest = streamed[-3:]
        if load_steps == 0:  # rebuilt in the step
            assert contents(trees.shared) == newest
            continue
        for _ in range(REBUILD_STEPS - 1):  # not before its due step: the old tree takes those groups
            assert trees.shared is before and trees.shared_next is not None
            streamed.append(finish_group(session, i))
            i += 1
            assert contents(before)[-1] == streamed[-1]
        streamed.append(finish_group(session, i))  # its due step: swapped in, then streamed into
        i += 1
        assert trees.shared_next is None and contents(trees.shared) == newest + streamed[-1:]
    assert crossings >= 3


def test_a_rebuild_that_fails_is_logged_and_the_old_tree_drafts_on(monkeypatch, caplog):
    session = TreeSession(load_steps=LOAD_STEPS)
    trees = session.trees

    def fail(*a):
        raise MemoryError("no room")

    monkeypatch.setattr(prompt_trees.SuffixTree, "from_sequences", fail)
    i = 0
    while trees.shared_next is None:
        finish_group(session, i)
        i += 1
    old = trees.shared
    with caplog.at_level(logging.ERROR, logger="srt"):
        for j in range(REBUILD_STEPS):
            finish_group(session, i + j)
    assert "cannot rebuild the run-wide tree: no room" in caplog.text
    assert trees.shared is old and old.sequences == i + REBUILD_STEPS
