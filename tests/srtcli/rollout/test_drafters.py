"""Drafters behind one interface: prompt lookup, SuffixDecoding-style global + prompt trees,
and the srt per-prompt tree (on-the-fly sharing inside a group, isolation between groups, and
appending only this run's sequences to a real LMDB sequence store)."""

from __future__ import annotations

import math
import random

from cache_store.seqstore import LmdbSequenceStore

from cache_store.store import load_tree
from srtcli.rollout.tree_session import TreeSession
from srtcli.store_link import StoreLink
from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.drafters.ngram import NgramDrafter
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.sequence import Sequence


def seq(prompt, out=(), group="g", runahead=False):
    s = Sequence(list(prompt), max_new_tokens=64, group=group, runahead=runahead)
    s.tokens += list(out)
    return s


def test_ngram_proposes_what_followed_the_latest_longest_match():
    d = NgramDrafter(max_n=3)
    assert d.propose(seq([1, 2, 3, 4, 5, 9, 1, 2, 3]), 3).tokens == [4, 5, 9]
    # the latest occurrence wins, and a longer match beats a more recent shorter one
    assert d.propose(seq([7, 1, 8, 1, 9, 7, 1]), 2).tokens == [8, 1]
    assert d.propose(seq([1, 2, 3]), 4).tokens == []
    assert d.propose(seq([5, 6, 5]), 4).tokens == [6, 5]


def reference_ngram(toks: list[int], budget: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """Prompt lookup written as the plain backward scan it is specified by."""
    n_max = min(max_n, len(toks) - 1)
    best_n, best_i = 0, -1
    for i in range(len(toks) - 2, -1, -1):
        m = 0
        while m < n_max and m <= i and toks[i - m] == toks[len(toks) - 1 - m]:
            m += 1
        if m > best_n:
            best_n, best_i = m, i
    return toks[best_i + 1: best_i + 1 + budget] if n_max >= min_n and best_n >= min_n else []


def test_ngram_matches_the_backward_scan_as_the_engine_extends_it():
    rng = random.Random(0)
    for case in range(400):
        min_n, max_n = rng.choice([(1, 3), (2, 4), (1, 1), (3, 3)])
        d = NgramDrafter(min_n=min_n, max_n=max_n)
        vocab = rng.choice([2, 3, 5, 20, 400])
        s = seq([rng.randrange(vocab) for _ in range(rng.randint(1, 6))])
        d.begin(s)
        for _ in range(rng.randint(1, 30)):  # past SCAN_MAX tokens too: the vectorised search
            new = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
            s.tokens += new
            d.extend(s, new)
            budget = rng.randint(1, 8)
            assert d.propose(s, budget).tokens == reference_ngram(s.tokens, budget, min_n, max_n), case
        assert NgramDrafter(min_n, max_n).propose(seq(s.tokens), 5).tokens == reference_ngram(s.tokens, 5, min_n, max_n)


def test_suffix_uses_the_global_tree_across_prompts_and_caps_by_match_length():
    d = make_drafter("suffix")
    a = seq([50, 51], group="a")
    d.begin(a)
    d.extend(a, [1, 2, 3, 4, 5, 6, 7, 8])
    d.end(a)
    b = seq([60, 61], [1, 2], group="b")  # another prompt: only the global tree knows 1 2 -> 3..
    d.begin(b)
    prop = d.propose(b, 8)
    assert prop.tokens == [3, 4]  # spec factor 1.0: at most match_len (2) tokens
    c = seq([9, 8, 7, 6, 5, 9, 8], group="c")  # the prompt tree knows 9 8 -> 7 6
    d.begin(c)
    assert d.propose(c, 8).tokens == [7, 6]


def test_srt_shares_tokens_within_a_group_at_once_and_not_across_groups():
    d = SrtDrafter(TreeSession(shared=False))  # the prompts' own trees alone
    a, b, other = seq([1, 2], group="g"), seq([1, 2], group="g"), seq([1, 2], group="h")
    for s in (a, b, other):
        d.begin(s)
    assert d.propose(b, 8).tokens == []
    d.extend(a, [7, 8, 9, 10])  # a generates; b drafts it from its very first token
    a.tokens += [7, 8, 9, 10]
    assert d.propose(b, 8).tokens == [7, 8, 9, 10]
    assert d.propose(other, 8).tokens == []
    d.extend(b, [7, 8])
    b.tokens += [7, 8]
    assert d.propose(b, 8).tokens == [9, 10]


def test_srt_drafts_from_the_run_wide_tree_only_when_it_predicts_more(tmp_path):
    store = LmdbSequenceStore.open(tmp_path / "cache")
    g, h = "a" * 32, "b" * 32
    session = TreeSession(StoreLink(store))  # the rollout's driver owns it: it appends and closes
    d = SrtDrafter(session)
    a = seq([1, 2], group=g)
    d.begin(a)
    d.extend(a, [7, 8, 9, 10])
    other = seq([1, 2], [7], group=h)  # another prompt: its own tree has nothing after 7
    d.begin(other)  # what the sequence already holds goes into the trees
    assert d.propose(other, 8).tokens == [8, 9, 10]  # from the run-wide tree
    d.extend(other, [5, 5])
    other.tokens += [5, 5]
    again = seq([1, 2], [7], group=h)
    d.begin(again)
    # h's tree: 7 -> 5 always; the run-wide tree: 7 -> 8 once, 7 -> 5 once: h's own tree wins
    assert d.propose(again, 8).tokens == [5, 5]
    for s in (a, other, again):
        d.end(s)
    d.group_done(g), d.group_done(h)
    session.commit()
    # the run-wide tree is never persisted: h's stored sequences are only h's own, anchor first
    assert [list(s.tokens) for s in store.read(h)] == [[2, 7, 5, 5], [2, 7]]
    assert load_tree(store, h).count([7, 5, 5]) == 1 and load_tree(store, h).count([8]) == 0
    store.close()


def test_the_run_wide_tree_stays_bounded_and_starts_again_from_its_newest_sequences(monkeypatch):
    import srtcli.rollout.drafters.prompt_trees as prompt_trees

    monkeypatch.setattr(prompt_trees, "SHARED_MAX_TOKENS", 500)
    monkeypatch.setattr(prompt_trees, "SHARED_KEEP", 100)
    d = SrtDrafter()
    streamed, renewals = [], 0
    for i in range(40):
        s, before = seq([1, 2], group=str(i)), d.session.trees.shared
        d.begin(s)
        out = [(i * 7 + k * 13) % 200 + 3 for k in range(30)]
        d.extend(s, out)
        streamed.append([2] + out)  # anchor first
        d.end(s)
        d.group_done(str(i))
        shared = d.session.trees.shared
        assert shared.stats().tokens <= 500 + 31  # at most one group's growth past the bound
        if shared is not before:  # renewed: the newest sequences that fit in SHARED_KEEP tokens
            renewals += 1
            kept = [list(shared.sequence(j)) for j in range(shared.stats().sequences)]
            assert kept == streamed[-3:]
            assert shared.count(streamed[-1][:5]) == 1 and shared.count(streamed[-4][:5]) == 0
    assert renewals >= 2


def test_the_run_wide_tree_is_renewed_before_it_holds_too_many_sequences(monkeypatch):
    """Short outputs fill a suffix tree's sequence table (524,287) long before its token bound."""
    import srtcli.rollout.drafters.prompt_trees as prompt_trees

    monkeypatch.setattr(prompt_trees, "SHARED_MAX_SEQUENCES", 40)
    d, streamed, renewals = SrtDrafter(), [], 0
    for i in range(100):
        s, before = seq([1, 2], group=str(i)), d.session.trees.shared
        d.begin(s)
        d.extend(s, [3 + i % 7])
        streamed.append([2, 3 + i % 7])  # anchor first
        d.end(s)
        d.group_done(str(i))
        shared = d.session.trees.shared
        assert shared.stats().sequences <= 41
        if shared is not before:  # renewed: the newest quarter of the bound
            renewals += 1
            assert [list(shared.sequence(j)) for j in range(shared.stats().sequences)] == streamed[-10:]
    assert renewals >= 2


def test_srt_sample_mode_records_the_distribution_it_sampled_from():
    d = SrtDrafter(mode="sample", min_prob=0.0)
    a, b = seq([1, 2]), seq([1, 2])
    d.begin(a)
    d.extend(a, [3, 4, 5])
    d.begin(b)
    d.extend(b, [3, 6, 5])
    c = seq([1, 2])
    d.begin(c)
    seen = set()
    for _ in range(50):
        p = d.propose(c, 3)
        assert p.q is not None and len(p.q) == len(p.tokens) == len(p.dists)
        for t, q, dist in zip(p.tokens, p.q, p.dists):
            assert math.isclose(sum(dist.values()), 1.0) and dist[t] == q
        seen.add(tuple(p.tokens[:2]))
    assert {(3, 4), (3, 6)} <= seen  # both children of 3 are sampled


def test_srt_appends_only_the_sequences_the_run_added(tmp_path):
    u, v = "c" * 32, "d" * 32
    store = LmdbSequenceStore.open(tmp_path / "cache")
    store.append(u, [[2, 5, 6]])
    session = TreeSession(StoreLink(store))  # the rollout's driver owns it: it appends and closes
    d = SrtDrafter(session)
    s = seq([1, 2], group=u)
    d.begin(s)
    assert d.propose(s, 4).tokens == [5, 6]  # loaded from the store
    d.extend(s, [5, 6])
    d.end(s)
    d.group_done(u)
    assert len(store.read(u)) == 1  # appends are batched ...
    session.commit()  # ... until the commit rule says so, or the rollout batch ends
    # the run's sequence (anchor first) is appended once; the loaded one is not written back
    assert [list(x.tokens) for x in store.read(u)] == [[2, 5, 6], [2, 5, 6]]
    assert load_tree(store, u).count([5, 6]) == 2
    assert d.stats()["cache_hit_rate"] == 1.0
    # run-ahead sequences of groups never rolled out are appended on close
    r = seq([3, 4], group=v, runahead=True)
    d.begin(r)
    d.extend(r, [8, 9])
    d.end(r)
    assert d.stats()["cache_groups"] == 1  # run-ahead loads do not count in the hit rate
    session.close()
    with LmdbSequenceStore.open(tmp_path / "cache") as store:
        assert [list(x.tokens) for x in store.read(v)] == [[4, 8, 9]]


def test_a_sequence_still_running_when_its_group_is_done_is_stored_whole_with_it(tmp_path):
    u = "e" * 32
    store = LmdbSequenceStore.open(tmp_path / "cache")
    session = TreeSession(StoreLink(store))  # the rollout's driver owns it: it appends and closes
    d = SrtDrafter(session)
    s = seq([1, 2], group=u)
    d.begin(s)
    d.extend(s, [5])
    d.group_done(u)  # e.g. a run-ahead sequence still running for a prompt whose group ended
    d.extend(s, [6, 7])
    session.commit()
    assert store.read(u) == []  # the group waits for its last sequence
    d.end(s)
    session.commit()
    assert [list(x.tokens) for x in store.read(u)] == [[2, 5, 6, 7]]
    store.close()


def test_a_prompt_retired_twice_before_an_append_keeps_both_groups(tmp_path):
    u = "f" * 32
    store = LmdbSequenceStore.open(tmp_path / "cache")
    session = TreeSession(StoreLink(store))  # the rollout's driver owns it: it appends and closes
    d = SrtDrafter(session)
    for toks in ([5, 6], [7, 8]):
        s = seq([1, 2], group=u, runahead=True)
        d.begin(s)
        d.extend(s, toks)
        d.end(s)
        d.group_done(u)
    session.close()
    with LmdbSequenceStore.open(tmp_path / "cache") as store:
        assert sorted(list(x.tokens) for x in store.read(u)) == [[2, 5, 6], [2, 7, 8]]


def test_srt_drafts_from_the_last_64_tokens_after_the_prompts_last_token():
    """The draft context is the tail of the sequence (at most 64 tokens, 24 in the run-wide
    tree), never reaching into the prompt past its last token, whatever the lengths: the
    drafts read off the sequence's streams are those looked up from that context."""
    import random

    from cache_store.store import TREE_DEPTH
    from tests.srtcli.rollout.context_drafts import context_draft

    rng = random.Random(0)
    for out_len in (0, 1, 5, 62, 63, 64, 65, 200):
        d = SrtDrafter(mode="greedy")
        prompt = [rng.randrange(5) for _ in range(rng.randrange(1, 4))]
        feed = Sequence(prompt, 1000, group="g")
        d.begin(feed)
        body = [rng.randrange(5) for _ in range(300)]
        feed.tokens += body
        d.extend(feed, body)
        s = Sequence(prompt, 1000, group="g")
        d.begin(s)
        out = body[:out_len]
        s.tokens += out
        d.extend(s, out)
        want_ctx = ([prompt[-1]] + out)[-TREE_DEPTH:]
        want = context_draft(d.session.trees.group("g").tree, d.session.trees.shared, want_ctx, 6, d.min_prob)
        assert d.propose(s, 6).tokens == want, out_len
