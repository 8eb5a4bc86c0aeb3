"""Byte layouts of the two record kinds in a cache: tree records and meta records.

A *tree record* (sub-database `trees`, key = uid) is one prompt's whole tree:

    offset size  field
    0      4     magic b"SRTC"
    4      1     record version (1)
    5      1     codec (1 = zstd)
    6      2     reserved (0)
    8      8     stamp: the logical tick the counts were last decayed to (u64)
    16     4     raw length: bytes of the uncompressed node table (u32)
    20     4     CRC-32 of bytes 0..20 and of the compressed payload (u32)
    24     ...   payload: one zstd frame holding `TokenTree.to_bytes()`

The whole tree is one frame because small frames barely compress (docs/cache.md has the
measurement). The checksum covers the compressed bytes, so `srt cache stats` finds
corrupt records without decompressing anything.

A *meta record* (sub-database `meta`, same key) is fixed-size and uncompressed, so
`stats` and `prune` can rank trees by recency and size without touching the trees.
All integers are little-endian. Compressor objects are reused, one per thread.
"""

from __future__ import annotations

import struct
import threading
import zlib
from dataclasses import dataclass

import zstandard

from cache_store.errors import CorruptRecord

MAGIC = b"SRTC"  # not the tree's b"SRTT": a record is a compressed, stamped tree
RECORD_VERSION = 1
CODEC_ZSTD = 1
ZSTD_LEVEL = 3  # bench_store: level 9 stores 10% less for ~5x the time, level 1 9% more for ~0.6x
_HEAD = struct.Struct("<4sBBHQI")  # magic, version, codec, reserved, stamp, raw length
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _CRC.size  # 24

_local = threading.local()


def _cctx() -> zstandard.ZstdCompressor:
    c = getattr(_local, "cctx", None)
    if c is None:
        c = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=False)
    return c


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def encode_record(node_table: bytes, stamp: int) -> bytes:
    """A tree record for an uncompressed node table stamped at logical tick `stamp`."""
    payload = _cctx().compress(node_table)
    head = _HEAD.pack(MAGIC, RECORD_VERSION, CODEC_ZSTD, 0, stamp, len(node_table))
    crc = zlib.crc32(payload, zlib.crc32(head))
    return head + _CRC.pack(crc) + payload


@dataclass(frozen=True)
class RecordHeader:
    """What a tree record says about itself, read without decompressing."""

    stamp: int
    raw_bytes: int
    disk_bytes: int


def check_record(value: bytes) -> RecordHeader:
    """Verify a record's header and checksum; raises CorruptRecord (no decompression)."""
    if len(value) < HEADER_BYTES:
        raise CorruptRecord(f"record too short ({len(value)} bytes)")
    magic, version, codec, _res, stamp, raw = _HEAD.unpack_from(value)
    if magic != MAGIC:
        raise CorruptRecord("bad magic")
    (crc,) = _CRC.unpack_from(value, _HEAD.size)
    mv = memoryview(value)
    if zlib.crc32(mv[HEADER_BYTES:], zlib.crc32(mv[: _HEAD.size])) != crc:
        raise CorruptRecord("checksum mismatch")
    if version != RECORD_VERSION or codec != CODEC_ZSTD:
        raise CorruptRecord(f"unknown record version {version} / codec {codec}")
    return RecordHeader(stamp=stamp, raw_bytes=raw, disk_bytes=len(value))


def decode_record(value: bytes) -> tuple[int, bytes]:
    """(stamp, node table) of a record; raises CorruptRecord."""
    head = check_record(value)
    try:
        table = _dctx().decompress(bytes(memoryview(value)[HEADER_BYTES:]), max_output_size=head.raw_bytes)
    except zstandard.ZstdError as e:
        raise CorruptRecord(f"zstd: {e}") from None
    if len(table) != head.raw_bytes:
        raise CorruptRecord("decompressed length differs from the header")
    return head.stamp, table


_META = struct.Struct("<BdQQIIId")  # version, wall, tick, stamp, disk, raw, nodes, mass
META_VERSION = 1
META_BYTES = _META.size + _CRC.size


@dataclass
class MetaRecord:
    """Per-tree bookkeeping kept beside the tree so stats/prune never decompress.

    `access_wall` (unix seconds) and `access_tick` are the last load or commit;
    `stamp` and `mass` describe the stored tree (count mass as of tick `stamp`).
    """

    access_wall: float
    access_tick: int
    stamp: int
    disk_bytes: int
    raw_bytes: int
    nodes: int
    mass: float

    def pack(self) -> bytes:
        body = _META.pack(
            META_VERSION, self.access_wall, self.access_tick, self.stamp,
            self.disk_bytes, self.raw_bytes, self.nodes, self.mass,
        )
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def unpack(cls, value: bytes) -> "MetaRecord":
        """Raises CorruptRecord on a wrong size, version or checksum."""
        if len(value) != _META.size + _CRC.size:
            raise CorruptRecord("meta record has the wrong size")
        body = bytes(value[: _META.size])
        if zlib.crc32(body) != _CRC.unpack_from(value, _META.size)[0]:
            raise CorruptRecord("meta checksum mismatch")
        version, *fields = _META.unpack(body)
        if version != META_VERSION:
            raise CorruptRecord(f"unknown meta version {version}")
        return cls(*fields)
