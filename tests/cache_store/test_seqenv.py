"""The sequence store's environment rules on a real LMDB: keys, settings, one environment per
path per process, a map that grows, what is refused, forks."""

from __future__ import annotations

import os
import random

import lmdb
import pytest

from cache_store.errors import FormatVersionError, NotACacheError
from cache_store.seqstore import LmdbSequenceStore
from cache_store.uid import is_uid, prompt_uid

U1, U2 = prompt_uid([1], "env"), prompt_uid([2], "env")


def test_uid_separates_tokenizers_and_prompts():
    a = prompt_uid([1, 2, 3], "tok-a")
    assert is_uid(a) and a == prompt_uid([1, 2, 3], "tok-a")
    assert a != prompt_uid([1, 2, 3], "tok-b") and a != prompt_uid([1, 2, 4], "tok-a")
    assert prompt_uid([], "ab") != prompt_uid([0x62], "a")  # the fingerprint's length is hashed
    for bad in ([-1], [2**32]):
        with pytest.raises(ValueError):
            prompt_uid(bad, "t")
    with pytest.raises(ValueError):
        prompt_uid([1], "")


def test_settings_are_fixed_at_creation(tmp_path):
    LmdbSequenceStore.open(tmp_path / "s", half_life=7.0, floor=0.5).close()
    s = LmdbSequenceStore.open(tmp_path / "s", half_life=99.0)
    assert (s.info()["half_life"], s.info()["floor"]) == (7.0, 0.5)
    s.close()


def test_one_environment_per_path_per_process(tmp_path):
    a, b = LmdbSequenceStore.open(tmp_path / "s"), LmdbSequenceStore.open(tmp_path / "s")
    assert a._e is b._e
    a.close()
    b.append(U1, [[1, 2]])  # still open for b
    b.close()
    with pytest.raises(lmdb.Error):
        b.append(U1, [[1, 2]])


def test_a_full_map_grows_instead_of_failing(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s")
    s._e.env.set_mapsize(256 * 1024)
    rng = random.Random(0)
    for i in range(12):  # ~40 KB of incompressible tokens each
        s.append(prompt_uid([i], "t"), [[rng.randrange(1 << 30) for _ in range(10_000)]])
    assert s._e.env.info()["map_size"] > 256 * 1024
    assert s.stats().sequences == 12
    s.close()


def test_refuses_what_is_not_a_cache_and_writes_nothing(tmp_path):
    with pytest.raises(NotACacheError, match="no srt cache"):
        LmdbSequenceStore.open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotACacheError, match="not a directory"):
        LmdbSequenceStore.open(tmp_path / "file")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(NotACacheError, match="not an srt cache"):
        LmdbSequenceStore.open(other)  # never initialise a cache over someone's files
    assert os.listdir(other) == ["notes.txt"]
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(b"\x01" * 8192)
    with pytest.raises(NotACacheError, match="not an srt cache"):
        LmdbSequenceStore.open(garbage)
    assert os.listdir(garbage) == ["data.mdb"]


def test_refuses_a_newer_format(tmp_path):
    LmdbSequenceStore.open(tmp_path / "s").close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"version", b"2", db=env.open_db(b"info", txn=txn))
    env.close()
    for _ in range(2):  # a refused open leaves nothing half-open behind in this process
        with pytest.raises(FormatVersionError, match="newer"):
            LmdbSequenceStore.open(tmp_path / "s")


def test_a_forked_child_opens_its_own_environment(tmp_path):
    s = LmdbSequenceStore.open(tmp_path / "s")
    s.append(U1, [[1, 2]])
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's handle
        code = 1
        try:
            c = LmdbSequenceStore.open(tmp_path / "s")
            code = 0 if (c._e is not s._e and len(c.read(U1)) == 1) else 2
            c.append(U2, [[3]])
            c.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [x.tokens.tolist() for x in s.read(U2)] == [[3]]
    s.append(U1, [[4]])  # the parent's handle and lock still work
    assert s.stats().sequences == 3
    s.close()
