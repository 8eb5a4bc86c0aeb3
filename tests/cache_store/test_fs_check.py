"""No LMDB cache on a network filesystem: the filesystem read from statfs, the refusal in one
line before anything is created, and the test hook that stands in for a network mount."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from cache_store import fs_check
from cache_store.errors import CacheError, NetworkFilesystemError
from cache_store.fs_check import REFUSE_ENV, TMPFS_MAGIC, check_local, fs_magic
from cache_store.seqstore import LmdbSequenceStore
from tests.cache_store.support import dir_digest

SHM = Path("/dev/shm")


def stat_type(path: Path) -> int:
    """The filesystem type as coreutils' `stat -f` reads it."""
    return int(subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True, text=True,
                              check=True).stdout, 16)


@pytest.fixture
def shm_dir():
    if not SHM.is_dir() or fs_magic(SHM) != TMPFS_MAGIC:
        pytest.skip("/dev/shm is not a tmpfs here")
    d = Path(tempfile.mkdtemp(dir=SHM, prefix="srt-fs-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(shutil.which("stat") is None, reason="no coreutils stat to compare with")
def test_statfs_reads_the_filesystem_type_stat_reads(tmp_path):
    assert fs_magic(tmp_path) == stat_type(tmp_path)
    assert fs_magic(tmp_path / "not" / "yet") == stat_type(tmp_path)  # where it would be created


def test_dev_shm_reads_as_tmpfs(shm_dir):
    assert fs_magic(shm_dir) == TMPFS_MAGIC == 0x01021994


def test_a_refused_filesystem_is_one_line_and_nothing_is_created(shm_dir, monkeypatch):
    LmdbSequenceStore.open(shm_dir / "old").close()  # a cache made before the filesystem was refused
    before = dir_digest(shm_dir / "old")
    (shm_dir / "empty").mkdir()
    monkeypatch.setenv(REFUSE_ENV, "deadbeef, 01021994")
    for target in (shm_dir / "new", shm_dir / "empty", shm_dir / "old"):
        with pytest.raises(NetworkFilesystemError) as e:
            LmdbSequenceStore.open(target)
        msg = str(e.value)
        assert isinstance(e.value, CacheError) and "\n" not in msg
        assert msg.startswith(f"{target}: on filesystem 0x01021994") and "redis://" in msg
    assert not (shm_dir / "new").exists() and list((shm_dir / "empty").iterdir()) == []
    assert dir_digest(shm_dir / "old") == before


def test_the_network_filesystems_are_named(tmp_path, monkeypatch):
    for magic, name in ((0x6969, "NFS"), (0xFF534D42, "CIFS"), (0xFE534D42, "SMB2"), (0x517B, "SMB"),
                        (0x0BD00BD0, "Lustre"), (0x47504653, "GPFS"), (0x00C36400, "CephFS"), (0x65735546, "FUSE")):
        monkeypatch.setattr(fs_check, "fs_magic", lambda _p, m=magic: m)
        with pytest.raises(NetworkFilesystemError, match=f"on {name} \\(statfs type 0x{magic:08x}\\)"):
            check_local(tmp_path)
    monkeypatch.setattr(fs_check, "fs_magic", lambda _p: None)  # statfs unreadable: allowed
    check_local(tmp_path)


def test_a_local_filesystem_is_allowed(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "s") as s:
        assert s.uids() == []
