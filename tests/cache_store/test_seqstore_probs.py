"""Token probabilities in the sequence store and the suffix tree: what the policy gave each token
is stored with it (record codec 2, one byte: within 0.002), read back, loaded into the tree, and drafted by;
records without them (codec 1, older caches) still load, and bad values are refused before
anything is written."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from cache_store import seqrecord
from cache_store.errors import CorruptRecord
from cache_store.seqstore import LmdbSequenceStore
from cache_store.store import load_tree
from cache_store.suffix_tree import SuffixTree, sample_draft
from cache_store.uid import prompt_uid

UID = prompt_uid([7], "probs")


def rollout(i: int, n: int = 30) -> tuple[list[int], list[float]]:
    r = random.Random(i)
    toks = [r.randrange(40) for _ in range(n)]
    probs = [math.nan] + [r.choice([0.0, 0.125, 0.5, 0.75, 1.0]) for _ in range(n - 1)]
    return toks, probs


def same(a, b, tol: float = 0.0) -> bool:
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(np.isnan(a), np.isnan(b)) and bool(
        (np.abs(np.nan_to_num(a) - np.nan_to_num(b)) <= tol).all())


STORED = 1 / 508  # a stored probability is within half a step of 1/254


def test_a_record_keeps_its_probabilities_and_every_byte_flip_is_caught():
    toks, probs = rollout(0)
    rec = seqrecord.encode(seqrecord.as_tokens(toks), 3, 0.5, seqrecord.as_probs(probs, len(toks)))
    head, t, p = seqrecord.decode_with_probs(rec)
    assert (head.codec, t.tolist()) == (seqrecord.CODEC_ZSTD_PLANES_PROBS, toks) and same(p, probs, STORED)
    assert not same(p, probs)  # quantised to 1/254: 0.125 is stored as 32/254
    assert seqrecord.decode(rec)[1].tolist() == toks
    assert same(seqrecord.decode_with_probs(seqrecord.restamp(rec, 9, 0.25))[2], p)
    for i in range(len(rec)):
        bad = bytearray(rec)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecord):
            seqrecord.check(bytes(bad))
    plain = seqrecord.encode(seqrecord.as_tokens(toks), 3, 0.5)
    assert seqrecord.decode_with_probs(plain)[2] is None  # codec 1, as every older record


def test_probabilities_survive_the_store_and_the_tree_load(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "c")
    (t0, p0), (t1, _) = rollout(0), rollout(1)
    s.append_many({UID: [t0, t1]}, {UID: [p0, None]})
    got = s.read(UID)
    assert [x.tokens.tolist() for x in got] == [t0, t1]
    assert same(got[0].probs, p0, STORED) and got[1].probs is None
    tree = load_tree(s, UID)
    assert same(tree.sequence_probs(0), got[0].probs) and tree.sequence_probs(1) is None
    s.close()


def test_bad_probabilities_raise_before_anything_is_written(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "c")
    toks, probs = rollout(2)
    for bad in ([0.5] * (len(toks) - 1), [1.5] + probs[1:], [-0.1] + probs[1:]):
        with pytest.raises(ValueError):
            s.append_many({UID: [toks]}, {UID: [bad]})
    with pytest.raises(ValueError):
        s.append_many({UID: [toks, toks]}, {UID: [probs]})
    assert s.read(UID) == []
    s.close()


def test_the_tree_keeps_probabilities_through_streams_and_trim():
    tree = SuffixTree(16)
    s = tree.stream()
    s.extend([1, 2])
    s.extend([3, 4], [0.5, 0.25])
    assert same(tree.sequence_probs(0), [math.nan, math.nan, 0.5, 0.25], STORED)  # one byte each
    tree.add([5, 6], 1.0, np.array([0.125, 1.0], dtype=np.float32))
    tree.trim()
    assert same(tree.sequence_probs(1), [0.125, 1.0], STORED)
    with pytest.raises(ValueError):
        s.extend([7], [2.0])
    with pytest.raises(ValueError):
        tree.add([1, 2, 3], 1.0, [0.5])
    assert tree.sequences == 2 and len(s) == 4


def test_a_reloaded_prompt_drafts_by_the_stored_probabilities(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "c")
    s.append_many({UID: [[9, 1, 2], [9, 3, 4]]}, {UID: [[math.nan, 0.25, 0.5], [math.nan, 0.5, 1.0]]})
    row = (load_tree(s, UID).stream(),)
    row[0].extend([9])
    (dist,) = sample_draft(row, 1, 0.0, random.Random(0).random, stop=True)[2]
    assert dist.keys() == {1, 3} and abs(dist[1] - 0.25) <= STORED and abs(dist[3] - 0.5) <= STORED
    s.close()


def test_the_tree_holds_exactly_what_the_store_would_give_back():
    """In memory a probability is the record's byte: a tree drafts by the same p-hat before a
    commit and after a load (values chosen at and around the half steps of 1/254)."""
    rng = np.random.default_rng(3)
    probs = np.concatenate([rng.random(200), (np.arange(254) + 0.5) / 254, [0.0, 1.0, np.nan]])
    tokens = rng.integers(0, 50, probs.size).tolist()
    tree = SuffixTree(8)
    tree.stream().extend(tokens, probs.tolist())
    byte = seqrecord.as_probs(np.asarray(probs, dtype=np.float32), probs.size)
    back = np.where(byte == 255, np.nan, byte / np.float32(254)).astype(np.float32)
    assert same(tree.sequence_probs(0), back)
