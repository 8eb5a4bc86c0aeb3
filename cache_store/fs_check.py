"""Refusing an LMDB cache on a network or FUSE filesystem.

LMDB shares a cache between processes through a memory map and POSIX locks on one machine's
page cache. On NFS, SMB/CIFS, Lustre, GPFS, CephFS or a FUSE mount, writers on other hosts see
neither, so concurrent appends can tear the file; multi-node runs share a cache server instead
(`redis://` URLs, cache_store.redis_store). `check_local(path)` is called before an LMDB store
is opened or created (cache_store.seqenv), so a refused directory is left as it was.

The filesystem is read from statfs(2)'s `f_type` through ctypes, for the directory itself or,
when it does not exist yet, its nearest existing parent (where it would be created).

Test hook: `SRT_REFUSE_FS_MAGIC`, comma-separated hexadecimal magic numbers (e.g. `01021994`,
tmpfs), refuses those filesystems too, so the refusal can be tested without a network mount.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from cache_store.errors import NetworkFilesystemError

REFUSED = {
    0x6969: "NFS",
    0x517B: "SMB",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2",
    0x0BD00BD0: "Lustre",
    0x47504653: "GPFS",
    0x00C36400: "CephFS",
    0x65735546: "FUSE",
}
TMPFS_MAGIC = 0x01021994
REFUSE_ENV = "SRT_REFUSE_FS_MAGIC"


class _StatFs(ctypes.Structure):
    """glibc's `struct statfs` on 64-bit Linux (x86_64 and aarch64 share it): 120 bytes,
    `f_type` first. Only `f_type` is read; the spare words leave room for the rest."""

    _fields_ = [("f_type", ctypes.c_long), ("f_bsize", ctypes.c_long),
                ("f_blocks", ctypes.c_ulong), ("f_bfree", ctypes.c_ulong), ("f_bavail", ctypes.c_ulong),
                ("f_files", ctypes.c_ulong), ("f_ffree", ctypes.c_ulong), ("f_fsid", ctypes.c_int * 2),
                ("f_namelen", ctypes.c_long), ("f_frsize", ctypes.c_long), ("f_flags", ctypes.c_long),
                ("f_spare", ctypes.c_long * 8)]


_statfs = None


def _statfs_fn():  # noqa: ANN202 - a ctypes function
    global _statfs
    if _statfs is None:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).statfs
        fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.POINTER(_StatFs)], ctypes.c_int
        _statfs = fn
    return _statfs


def fs_magic(path: str | Path) -> int | None:
    """statfs's `f_type` of the filesystem holding `path` (or its nearest existing parent);
    None where it cannot be read (not Linux, no libc, a failing call)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        buf = _StatFs()
        if _statfs_fn()(os.fsencode(p), ctypes.byref(buf)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return buf.f_type & 0xFFFFFFFF  # a 32-bit magic, whatever the word's sign


def refused_magics() -> dict[int, str]:
    """The refused filesystems, with those the test hook adds."""
    out = dict(REFUSED)
    for word in os.environ.get(REFUSE_ENV, "").split(","):
        if word.strip():
            out[int(word.strip(), 16)] = f"filesystem 0x{int(word.strip(), 16):08x}"
    return out


def check_local(path: str | Path) -> None:
    """NetworkFilesystemError if `path` lies on a filesystem an LMDB cache must not use.

    Where statfs cannot be read the open goes ahead: the check guards against a known danger,
    and refusing every cache on a platform without statfs would refuse the safe ones too."""
    magic = fs_magic(path)
    name = None if magic is None else refused_magics().get(magic)
    if name is not None:
        raise NetworkFilesystemError(
            f"{path}: on {name} (statfs type 0x{magic:08x}), a network or FUSE filesystem where an "
            "LMDB cache is not safe; use a cache server instead: a redis://HOST:PORT/DB URL as the cache")
