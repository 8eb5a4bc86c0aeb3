"""The proposer's tree work on several threads (`ProposerSettings.threads`) drafts and stores exactly what
it does on one: appends run one tree per thread at a time, drafts only read."""

from __future__ import annotations

import os
import random

from cache_store.seqstore import LmdbSequenceStore
from srtcli.store_link import StoreLink
from srtcli.rollout.vllm import tree_drafts
from srtcli.rollout.vllm.settings import ProposerSettings
from srtcli.rollout.vllm.tree_drafts import FEED_THREADS, TreeDrafts, feed_threads
from tests.srtcli.rollout.vllm.test_vllm_proposer import EOS, FP, MAX_NEW, _outputs, simulate, stored


def test_threads_draft_and_store_what_one_thread_does(tmp_path, monkeypatch):
    monkeypatch.setattr(tree_drafts, "THREAD_TOKENS", 0)  # these steps are small: threads every step
    monkeypatch.setattr(tree_drafts, "THREAD_ROWS", 0)
    asked = set()  # the threads each call was given, to see that they were
    for name in ("feed_many", "draft_many"):
        real = getattr(tree_drafts, name)
        monkeypatch.setattr(tree_drafts, name, lambda *a, _real=real, _name=name: asked.add((_name, a[-1])) or _real(*a))
    for seed in range(3):
        runs = []
        for threads in (1, 3):
            with LmdbSequenceStore.open(tmp_path / f"{seed}-{threads}") as store:
                settings = ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, fingerprint=FP, threads=threads)
                for epoch in range(2):  # the second drafts from the first's stored trees too
                    got = simulate(TreeDrafts(settings, 4, 64, link=StoreLink(store)), _outputs(random.Random(seed + epoch)), 5,
                                   random.Random(seed))
                runs.append((got, stored(store)))
        assert runs[0] == runs[1]
        assert asked == {("feed_many", 1), ("feed_many", 3), ("draft_many", 1), ("draft_many", 3)}
        assert any(any(d) for d in runs[0][0][0])  # it did draft


def test_the_default_is_the_cores_this_process_may_use_at_most_four():
    cores = len(os.sched_getaffinity(0))
    assert feed_threads() == min(FEED_THREADS, cores) and FEED_THREADS == 4
    assert TreeDrafts(ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, fingerprint=FP), 4, 64).threads == feed_threads()
    assert TreeDrafts(ProposerSettings(None, MAX_NEW, [EOS], adaptive=True, fingerprint=FP, threads=3), 4, 64).threads == 3
