"""Token tree semantics on hand-made examples: counts, drafting, decay, merge, bytes, limits."""

from __future__ import annotations

import pickle
import random
import struct
import threading
from collections import Counter

import numpy as np
import pytest

from cache_store.trie import Draft, DraftTree, TokenTree


def substrings(seqs, d):
    """Occurrences of every substring of length 1..d (the counts a suffix trie must hold)."""
    occ = Counter()
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + d) + 1):
                occ[tuple(s[i:j])] += 1
    return occ


# -- counts --------------------------------------------------------------------------------

def test_counts_are_substring_occurrences_and_parent_is_children_plus_ends():
    rng = random.Random(7)
    d = 5
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(8)]
    t = TokenTree(d)
    for s in seqs:
        t.insert(s)
    occ = substrings(seqs, d)
    assert t.nodes == len(occ)
    assert t.mass == sum(len(s) for s in seqs)
    for p, n in occ.items():
        assert t.count(p) == n
        if len(p) < d:  # below max depth: count = sum of children + sequences ending here
            kids = sum(t.count(p + (x,)) for x in range(4))
            ends = sum(1 for s in seqs if tuple(s[len(s) - len(p):]) == p)
            assert t.count(p) == kids + ends
    assert t.count([3, 3, 3, 3, 3, 3]) == 0.0  # longer than max_depth
    assert t.count([]) == t.mass


def test_max_depth_is_respected_and_stored():
    t = TokenTree(3)
    t.insert([1, 2, 3, 4, 5])
    assert t.count([1, 2, 3]) == 1.0 and t.count([3, 4, 5]) == 1.0
    assert t.count([1, 2, 3, 4]) == 0.0
    assert t.nodes == 5 + 4 + 3  # substrings of lengths 1, 2, 3
    assert TokenTree.from_bytes(t.to_bytes()).max_depth == 3
    for bad in (0, 1, 1025, -3):
        with pytest.raises(ValueError):
            TokenTree(bad)


def test_stream_chunks_and_interleaved_streams_equal_whole_inserts():
    rng = random.Random(1)
    seqs = [[rng.randrange(6) for _ in range(50)] for _ in range(3)]
    whole = TokenTree(8)
    for s in seqs:
        whole.insert(s)
    t = TokenTree(8)
    streams = [t.stream() for _ in seqs]
    pos = [0] * len(seqs)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        i = rng.randrange(len(seqs))
        k = rng.randrange(0, 7)
        streams[i].extend(seqs[i][pos[i]:pos[i] + k])
        pos[i] += k
    assert t.to_bytes() == whole.to_bytes()


def test_bad_tokens_raise_and_insert_nothing():
    t = TokenTree(4)
    t.insert([1, 2])
    before = t.to_bytes()
    for bad in ([3, -1], [3, 2**31], [3, 2**70]):
        with pytest.raises(ValueError):
            t.insert(bad)
        with pytest.raises(ValueError):
            t.stream().extend(bad)
    with pytest.raises(TypeError):
        t.insert([3, "a"])
    with pytest.raises(TypeError):
        t.insert(5)
    assert t.to_bytes() == before


def test_numpy_and_other_iterables_are_accepted():
    a, b = TokenTree(4), TokenTree(4)
    a.insert(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    b.insert(iter([1, 2, 3, 1, 2]))
    assert a.to_bytes() == b.to_bytes()
    assert a.draft(np.array([5, 1], dtype=np.int32)).tokens == [2, 3, 1]
    assert a.draft((1,)).tokens == [2, 3, 1]


def test_stream_keeps_its_tree_alive():
    t = TokenTree(4)
    s = t.stream()
    del t
    s.extend([1, 2, 3])  # must not touch freed memory


# -- drafting ------------------------------------------------------------------------------

def test_draft_follows_longest_match_then_highest_c():
    t = TokenTree(16)
    t.insert([1, 2, 3, 4, 4])
    t.insert([9, 2, 3, 5, 6])
    assert t.draft([1, 2, 3]) == Draft([4, 4], [1.0, 1.0], 3)
    # [7, 2, 3] matches only [2, 3]: children 4 and 5 tie (count 1), the lower token wins
    assert t.draft([7, 2, 3]) == Draft([4, 4], [0.5, 1.0], 2)


def test_c_divides_by_the_children_not_by_the_parent():
    t = TokenTree(8)
    for s in ([1, 2], [1, 3, 4], [1]):  # [1] occurs 3 times, once as an end
        t.insert(s)
    d = t.draft([1], min_prob=0.0)
    assert d.tokens[0] == 2 and d.probs[0] == 0.5


def test_greedy_threshold_and_budget():
    t = TokenTree(8)
    t.insert([5, 1, 2])
    t.insert([5, 1, 3])
    t.insert([5, 1, 3])
    assert t.draft([5]) == Draft([1, 3], [1.0, 2 / 3], 1)
    assert t.draft([5], min_prob=0.7) == Draft([1], [1.0], 1)  # path score 2/3 < 0.7 stops
    assert t.draft([5], budget=1) == Draft([1], [1.0], 1)
    assert t.draft([5], budget=0) == Draft([], [], 1)
    long = TokenTree(64)
    long.insert(list(range(100)))
    assert long.draft([0], budget=16).tokens == list(range(1, 17))


def test_empty_draft_when_nothing_matches():
    t = TokenTree(8)
    assert t.draft([1, 2]) == Draft([], [], 0)
    t.insert([1, 2])
    assert t.draft([42]) == Draft([], [], 0)
    assert t.draft([]) == Draft([], [], 0)
    assert t.draft([2]) == Draft([], [], 0)  # [2] only ever ended a sequence
    assert t.draft_tree([42]) == DraftTree([], [], [], 0)


def test_match_falls_back_to_a_shorter_tail_with_children():
    t = TokenTree(16)
    t.insert([1, 2, 3])
    t.insert([3, 4])
    # [1, 2, 3] and [2, 3] only end sequences; [3] continues with 4
    assert t.draft([1, 2, 3]) == Draft([4], [1.0], 1)


def test_match_is_capped_to_leave_room_for_the_draft():
    t = TokenTree(8)
    t.insert(list(range(20)))
    # cap = max_depth - min(budget, max_depth // 2) = 8 - 4: four tokens of context, four of draft
    d = t.draft(list(range(10)), budget=16)
    assert d.match_len == 4 and d.tokens == [10, 11, 12, 13]
    d = t.draft(list(range(10)), budget=2)  # cap = 8 - 2
    assert d.match_len == 6 and d.tokens == [10, 11]


def test_draft_tree_is_best_first():
    t = TokenTree(64)
    for s, k in (([0, 1, 2], 3), ([0, 1, 3], 1), ([0, 4], 2)):
        for _ in range(k):
            t.insert(s)
    dt = t.draft_tree([0], budget=16, min_prob=0.1)
    assert dt == DraftTree([1, 2, 4, 3], [-1, 0, -1, 0], [4 / 6, 3 / 4, 2 / 6, 1 / 4], 1)
    # a smaller budget takes a prefix of the same order; the threshold cuts low path scores
    assert t.draft_tree([0], budget=2) == DraftTree([1, 2], [-1, 0], [4 / 6, 3 / 4], 1)
    assert t.draft_tree([0], min_prob=0.3).tokens == [1, 2, 4]


def test_draft_tree_order_on_random_trees():
    rng = random.Random(3)
    for _ in range(30):
        t = TokenTree(12)
        base = [rng.randrange(5) for _ in range(60)]
        for _ in range(6):
            t.insert([x if rng.random() > 0.2 else rng.randrange(5) for x in base])
        ctx = base[: rng.randrange(1, 20)]
        dt = t.draft_tree(ctx, budget=24, min_prob=0.01)
        scores = []
        for i, (p, c) in enumerate(zip(dt.parents, dt.probs)):
            assert -1 <= p < i
            scores.append(c * (scores[p] if p >= 0 else 1.0))
        assert scores == sorted(scores, reverse=True)
        assert all(s >= 0.01 for s in scores) and len(dt.tokens) <= 24
        greedy = t.draft(ctx, budget=24, min_prob=0.01)
        assert dt.tokens[:1] == greedy.tokens[:1] and dt.match_len == greedy.match_len


# -- decay, merge ---------------------------------------------------------------------------

def test_scale_multiplies_and_drops_below_floor_with_subtrees():
    t = TokenTree(8)
    t.insert([1, 2, 3])
    t.insert([1, 2, 3])
    t.insert([1, 2])
    t.scale(0.5)
    assert t.count([1, 2]) == 1.5 and t.count([1, 2, 3]) == 1.0 and t.mass == 4.0
    t.scale(0.5, floor=0.7)  # [1,2]: .75 kept; [1,2,3], [2,3], [3]: .5 dropped
    assert t.count([1, 2]) == 0.75 and t.count([1, 2, 3]) == 0.0 and t.count([3]) == 0.0
    assert t.nodes == 3 and t.mass == 1.5
    assert t.draft([1]).tokens == [2]
    t.scale(0.0)  # zero counts never stay in the tree
    assert t.nodes == 0 and t.mass == 0.0
    for bad in ((-1.0, 0.0), (float("nan"), 0.0), (1.0, float("inf")), (1.0, -0.5)):
        with pytest.raises(ValueError):
            t.scale(*bad)


def test_stream_after_drop_extends_only_surviving_contexts():
    t = TokenTree(8)
    s = t.stream()
    s.extend([1, 2, 3])
    t.insert([2, 3])
    t.scale(0.5, floor=0.6)  # keeps [2], [3], [2, 3] (count 1.0); drops everything with 1
    s.extend([4])
    assert t.count([2, 3, 4]) == 1.0 and t.count([3, 4]) == 1.0 and t.count([4]) == 1.0
    assert t.count([1, 2, 3, 4]) == 0.0


def test_merge_adds_counts():
    a, b = TokenTree(6), TokenTree(6)
    a.insert([1, 2, 3])
    b.insert([1, 2, 4])
    b.scale(0.5)
    a.merge(b)
    assert a.count([1, 2]) == 1.5 and a.count([1, 2, 4]) == 0.5 and a.count([1, 2, 3]) == 1.0
    a.merge(a)
    assert a.count([1, 2]) == 3.0
    with pytest.raises(ValueError):
        a.merge(TokenTree(7))
    with pytest.raises(TypeError):
        a.merge(b.to_bytes())


def test_copy_is_independent():
    a = TokenTree(6)
    a.insert([1, 2, 3])
    b = a.copy()
    b.insert([1, 2, 3])
    assert a.count([1, 2]) == 1.0 and b.count([1, 2]) == 2.0


# -- bytes ---------------------------------------------------------------------------------

def sample_tree() -> TokenTree:
    t = TokenTree(6)
    t.insert([1, 2, 3, 1, 2, 4])
    t.insert([7, 1, 2])
    t.scale(0.75)
    return t


def test_bytes_round_trip_and_pickle():
    t = sample_tree()
    b = t.to_bytes()
    assert len(b) == 16 + 16 * t.nodes and b[:4] == b"SRTT"
    for data in (b, bytearray(b), memoryview(b)):
        u = TokenTree.from_bytes(data)
        assert u.to_bytes() == b and u.draft([1]) == t.draft([1])
    assert pickle.loads(pickle.dumps(t)).to_bytes() == b
    assert TokenTree.from_bytes(TokenTree(64).to_bytes()).nodes == 0


def patched(b: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(b)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_bad_bytes_raise_value_error():
    t = sample_tree()
    b = t.to_bytes()
    n = t.nodes
    par, tok, cnt = 16, 16 + 4 * n, 16 + 8 * n
    bad = {
        "truncated": b[:-1],
        "extra": b + b"\0",
        "magic": b"XXXX" + b[4:],
        "version": patched(b, 4, "<H", 2),
        "depth": patched(b, 8, "<I", 1),
        "big depth": patched(b, 8, "<I", 10**6),
        "count field": patched(b, 12, "<I", n + 1),
        "parent after child": patched(b, par + 4 * 3, "<I", 5),
        "token range": patched(b, tok, "<I", 2**31),
        "nan": patched(b, cnt, "<d", float("nan")),
        "zero": patched(b, cnt + 8, "<d", 0.0),
        "negative": patched(b, cnt + 8, "<d", -1.0),
        "duplicate": patched(b, tok + 4, "<I", struct.unpack_from("<I", b, tok)[0]),
    }
    # two root children swapped: a well-formed tree, but not the canonical order to_bytes writes
    t0, t1 = struct.unpack_from("<2I", b, tok)
    c0, c1 = struct.unpack_from("<2d", b, cnt)
    swapped = patched(patched(b, tok, "<I", t1), tok + 4, "<I", t0)
    bad["sibling order"] = patched(patched(swapped, cnt, "<d", c1), cnt + 8, "<d", c0)
    deep = TokenTree(3)
    deep.insert([1, 2, 3])
    bad["too deep"] = patched(deep.to_bytes(), 8, "<I", 2)
    for why, data in bad.items():
        with pytest.raises(ValueError):
            TokenTree.from_bytes(data)
    with pytest.raises(ValueError, match="version"):
        TokenTree.from_bytes(bad["version"])
    for cut in range(len(b)):
        with pytest.raises(ValueError):
            TokenTree.from_bytes(b[:cut])
    with pytest.raises(TypeError):
        TokenTree.from_bytes("not bytes")


def test_random_corruption_never_crashes():
    rng = random.Random(11)
    b = sample_tree().to_bytes()
    for _ in range(3000):
        data = bytearray(b)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            u = TokenTree.from_bytes(bytes(data))
        except ValueError:
            continue
        # a record that still parses is a well-formed tree: every operation must work on it
        u.draft([1, 2], budget=8, min_prob=0.0)
        u.draft_tree([7, 1], budget=8, min_prob=0.0)
        u.insert([1, 2, 3])
        u.scale(0.5, floor=0.2)
        other = TokenTree(u.max_depth)
        other.insert([1, 2, 4])
        u.merge(other)
        assert TokenTree.from_bytes(u.to_bytes()).to_bytes() == u.to_bytes()


# -- scale of use ---------------------------------------------------------------------------

def test_large_vocab_and_many_nodes_grow_correctly():
    rng = random.Random(5)
    seqs = [[rng.randrange(50_000) for _ in range(3000)] for _ in range(4)]
    seqs.append(seqs[0][100:900])  # a repeated stretch
    t = TokenTree(6)
    for s in seqs:
        t.insert(s)
    occ = substrings(seqs, 6)
    assert t.nodes == len(occ)
    for p in rng.sample(sorted(occ), 500):
        assert t.count(p) == occ[p]
    # match capped at 6 - 3 tokens, leaving 3 of room below it
    d = t.draft(seqs[0][:150], budget=16, min_prob=0.0)
    assert d.tokens == seqs[0][150:153] and d.match_len == 3
    assert t.memory_bytes() < 200 * t.nodes


def test_threads_sharing_a_tree_see_whole_operations():
    # every call holds the GIL; interleaved streams from threads must equal the same inserts
    rng = random.Random(9)
    seqs = [[rng.randrange(8) for _ in range(400)] for _ in range(4)]
    t = TokenTree(10)

    def work(seq):
        s = t.stream()
        for i in range(0, len(seq), 3):
            s.extend(seq[i:i + 3])
            t.draft(seq[:i + 1], budget=8)
            t.draft_tree(seq[:i + 1], budget=8)

    threads = [threading.Thread(target=work, args=(s,)) for s in seqs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    whole = TokenTree(10)
    for s in seqs:
        whole.insert(s)
    assert t.to_bytes() == whole.to_bytes()
