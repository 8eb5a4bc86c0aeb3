"""Loads off the step: a prompt's stored tree builds in a thread while its group streams into an
empty tree, and `load_steps` steps later the group moves onto it (`PromptTrees.adopt`). From then
on the proposer must draft exactly what one that loads inside the step drafts, and both must
store the same sequences; only a group's first `load_steps` steps may draft differently. Loads
within a step's `inline_tokens` are built in the step (these stores are small: the tests set it
to 0 to build off the step). A move that runs out of memory part way leaves the group whole on
the tree it streamed into, and every sequence is still stored whole."""

from __future__ import annotations

import logging
import random
import types

import numpy as np

from cache_store.seqstore import LmdbSequenceStore
from cache_store.suffix_tree import SuffixStream, SuffixTree
from srtcli.store_link import StoreLink
from srtcli.rollout.vllm.settings import ProposerSettings
from srtcli.rollout.vllm.tree_drafts import TreeDrafts
from tests.srtcli.rollout.vllm.test_vllm_proposer import EOS, FP, MAX_NEW, PROMPTS, UID_A, _outputs, simulate, stored


def _settings(**kw) -> ProposerSettings:
    return ProposerSettings(None, MAX_NEW, [EOS], adaptive=False, fingerprint=FP, **kw)


class Recording(TreeDrafts):
    """Records, per step, the rows whose group started loading in that step."""

    def propose(self, sampled, num, ids):
        out = super().propose(sampled, num, ids)
        self.first.append({i for i, s in self.tracker.rows.items() if any(s.group is g for g in self.session.trees.loading)})
        return out


def replace_without_moving(trees) -> None:
    """Bug: the loaded tree replaces the group's, its streams left writing to the old one."""
    trees.step += 1
    for g in [g for g in trees.loading if g.due <= trees.step]:
        trees.loading.remove(g)
        g.tree, g.loading, g.moving = g.loading.result(), None, []


def failing_move(monkeypatch, at: int) -> None:
    """Fault injection: the `at`-th stream move (counting from 1) runs out of memory; the others,
    moves back included, succeed."""
    move, calls = SuffixStream.move, [0]

    def flaky(self, tree):
        calls[0] += 1
        if calls[0] == at:
            raise MemoryError("no room to move the stream")
        move(self, tree)

    monkeypatch.setattr(SuffixStream, "move", flaky)


def keep_what_moved(trees, g, tree) -> None:
    """Bug: a move that fails part way leaves the group split over two trees (the streams moved
    stay on the new one, the group and its commits on the old one)."""
    try:
        for stream in g.moving:
            stream.move(tree)
    except MemoryError:
        pass
    g.added = [stream.sequence_id for stream in g.moving]


def disagreement(tmp_path, seed: int, adopt=None, inline_tokens: int = 0, move=None,
                 drafts: bool = True) -> str | None:
    """Fill two stores alike, then run a second epoch on each: loads off the step on one, inside
    the step on the other. None when they agree everywhere they must (`drafts=False`: what they
    store, not what they draft)."""
    rng = random.Random(seed)
    first, second = _outputs(rng), _outputs(rng) + [(UID_A, [EOS])]  # one that ends in its first step
    with LmdbSequenceStore.open(tmp_path / "off") as off, LmdbSequenceStore.open(tmp_path / "in") as inside:
        for store in (off, inside):
            simulate(TreeDrafts(_settings(load_steps=0), 4, 64, link=StoreLink(store)), first, 4, random.Random(seed))
        lazy = Recording(_settings(), 4, 64, link=StoreLink(off))
        lazy.first, lazy.session.trees.inline_tokens = [], inline_tokens
        if adopt:
            lazy.session.trees.adopt = types.MethodType(adopt, lazy.session.trees)
        if move:
            lazy.session.trees._move = types.MethodType(move, lazy.session.trees)
        try:
            got, counts = simulate(lazy, second, 4, random.Random(seed + 1))
        except IndexError as e:
            return f"crashed: {e}"
        want, want_counts = simulate(TreeDrafts(_settings(load_steps=0), 4, 64, link=StoreLink(inside)), second, 4,
                                     random.Random(seed + 1))
        if stored(off) != stored(inside):
            return "stored sequences differ"
        if not (counts["groups"], counts["hits"]) == (want_counts["groups"], want_counts["hits"]) == (3, 3):
            return "groups or hits differ"
        if not drafts:
            return None
        for step, (g, w, new) in enumerate(zip(got, want, lazy.first)):
            if any(g[i] != w[i] for i in range(len(g)) if i not in new):
                return f"step {step}: drafts differ after the load was adopted"
        if (got == want) != (inline_tokens > 0):
            return "the loads were not where they should be built (off the step, or in it)"
    return None


def test_after_its_first_step_a_group_drafts_and_stores_as_if_loaded_in_the_step(tmp_path):
    for seed in range(4):
        assert disagreement(tmp_path / str(seed), seed) is None


def test_small_loads_are_built_in_the_step(tmp_path):
    assert disagreement(tmp_path, 0, inline_tokens=1 << 20) is None


def test_a_group_left_on_its_empty_tree_is_caught(tmp_path):
    assert disagreement(tmp_path, 0, adopt=replace_without_moving) is not None


def test_a_build_that_fails_is_logged_and_the_group_drafts_on(tmp_path, monkeypatch, caplog):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        simulate(TreeDrafts(_settings(load_steps=0), 4, 64, link=StoreLink(store)), _outputs(random.Random(0)), 4,
                 random.Random(0))
        before = stored(store)

        def broken(cls, seqs, max_depth=64):
            raise MemoryError("no room for the tree")

        monkeypatch.setattr(SuffixTree, "from_sequences", classmethod(broken))
        d = TreeDrafts(_settings(load_steps=1), 4, 64, link=StoreLink(store))
        d.session.trees.inline_tokens = 0
        ids = np.zeros((1, 64), dtype=np.int64)
        p = PROMPTS[UID_A]
        ids[0, : len(p) + 2] = p + [30, EOS]
        with caplog.at_level(logging.ERROR, "srt"):
            d.propose([[30]], np.array([len(p) + 1]), ids)
            d.propose([[EOS]], np.array([len(p) + 2]), ids)
        assert "cannot build a prompt's tree" in caplog.text
        d.finish()
        assert stored(store)[UID_A] == sorted(before[UID_A] + [(p[-1], 30, EOS)])


def test_a_move_that_runs_out_of_memory_is_logged_and_the_group_stores_every_sequence(tmp_path, monkeypatch,
                                                                                      caplog):
    failing_move(monkeypatch, at=2)  # a group's second stream: the first one has to go back
    with caplog.at_level(logging.ERROR, "srt"):
        assert disagreement(tmp_path, 0, drafts=False) is None
    assert "no memory to move a prompt's group" in caplog.text


def test_a_group_split_over_two_trees_is_caught(tmp_path, monkeypatch):
    failing_move(monkeypatch, at=2)
    assert disagreement(tmp_path, 0, move=keep_what_moved, drafts=False) is not None
