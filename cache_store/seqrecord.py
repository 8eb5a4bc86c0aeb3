"""Byte layout of one stored rollout in the sequence store (cache_store.store).

A *sequence record* (sub-database `seqs`, key = prompt uid (32 ASCII hex) + u32 big-endian
record number, so a prompt's records are adjacent and in append order):

    offset size  field
    0      4     magic b"SRTS"
    4      1     record version (1)
    5      1     codec (1 = zstd of the token array split into its 4 byte planes;
                 2 = zstd of those planes followed by one byte per token: its
                 probability, round(p x 254), 255 for unknown)
    6      2     reserved (0)
    8      8     tick: the logical tick the sequence was written at (u64)
    16     8     weight at that tick (f64, > 0)
    24     4     tokens (u32)
    28     4     CRC-32 of bytes 0..28 and of the payload (u32)
    32     ...   payload

Splitting the int32 tokens into byte planes (all low bytes, then all second bytes, ...) puts
the nearly constant high bytes of token ids together, which zstd then stores in almost
nothing; measured by bench/cache_bench.py --scale. The checksum covers the compressed bytes,
so a scan finds corrupt records without decompressing. All integers are little-endian.

The probabilities (codec 2) are what the policy gave each token when it generated it (NaN
where unknown, 0 for tool output); drafting uses them as its proposal (cache_store.suffix_tree
`sample_draft`). One byte keeps them to within 0.002, which can cost a drafted token about that
much of its acceptance and nothing in exactness (verification uses the q the draft was drawn
with). A record of codec 2 is one byte per token more before compression; tokens the policy
was sure of (p near 1) repeat the same byte, which zstd stores in almost nothing.
"""

from __future__ import annotations

import struct
import threading
import zlib
from dataclasses import dataclass

import numpy as np
import zstandard

from cache_store.errors import CorruptRecord

MAGIC = b"SRTS"
RECORD_VERSION = 1
CODEC_ZSTD_PLANES = 1
CODEC_ZSTD_PLANES_PROBS = 2
CODECS = (CODEC_ZSTD_PLANES, CODEC_ZSTD_PLANES_PROBS)
ZSTD_LEVEL = 3
_HEAD = struct.Struct("<4sBBHQdI")  # magic, version, codec, reserved, tick, weight, tokens
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _CRC.size  # 32
MAX_TOKEN_ID = 2**31 - 1

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


def as_tokens(tokens) -> np.ndarray:  # noqa: ANN001 - any sequence of ints
    """`tokens` as a contiguous little-endian int32 array; ValueError for ids outside [0, 2**31)."""
    a = np.asarray(tokens)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError("tokens must be a flat sequence of integers")
    if a.size and (int(a.min()) < 0 or int(a.max()) > MAX_TOKEN_ID):
        raise ValueError(f"token ids must be in [0, {MAX_TOKEN_ID}]")
    return np.ascontiguousarray(a, dtype="<i4")


PROB_STEPS, PROB_UNKNOWN = 254, 255


def as_probs(probs, n: int) -> np.ndarray:  # noqa: ANN001 - any sequence of floats
    """`probs` as n bytes, round(p x 254) (255: NaN, unknown); ValueError unless each is in
    [0, 1] or NaN."""
    a = np.asarray(probs, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"probs must hold one value per token ({n}), got shape {a.shape}")
    unknown = np.isnan(a)
    known = a[~unknown]
    if known.size and (known.min() < 0 or known.max() > 1):
        raise ValueError("probs must be in [0, 1] (or NaN for unknown)")
    return np.where(unknown, PROB_UNKNOWN, np.rint(np.nan_to_num(a) * PROB_STEPS)).astype(np.uint8)


def encode(tokens: np.ndarray, tick: int, weight: float, probs: np.ndarray | None = None) -> bytes:
    """The record of one sequence (int32 array from `as_tokens`) written at `tick`, with its
    tokens' probabilities (bytes from `as_probs`) when given."""
    if not (weight > 0) or weight == float("inf"):
        raise ValueError(f"weight must be finite and > 0, got {weight}")
    planes = tokens.view(np.uint8).reshape(-1, 4).T.tobytes()
    codec = CODEC_ZSTD_PLANES
    if probs is not None:
        planes += probs.tobytes()
        codec = CODEC_ZSTD_PLANES_PROBS
    payload = _cctx().compress(planes)
    head = _HEAD.pack(MAGIC, RECORD_VERSION, codec, 0, tick, weight, tokens.size)
    return head + _CRC.pack(zlib.crc32(payload, zlib.crc32(head))) + payload


@dataclass(frozen=True)
class SeqHeader:
    """What a record says about itself, read without decompressing."""

    tick: int
    weight: float
    tokens: int
    disk_bytes: int
    codec: int = CODEC_ZSTD_PLANES


def check(value: bytes | memoryview) -> SeqHeader:
    """Verify a record's header and checksum; raises CorruptRecord (no decompression)."""
    if len(value) < HEADER_BYTES:
        raise CorruptRecord(f"record too short ({len(value)} bytes)")
    magic, version, codec, _res, tick, weight, n = _HEAD.unpack_from(value)
    if magic != MAGIC:
        raise CorruptRecord("bad magic")
    mv = memoryview(value)
    if zlib.crc32(mv[HEADER_BYTES:], zlib.crc32(mv[: _HEAD.size])) != _CRC.unpack_from(value, _HEAD.size)[0]:
        raise CorruptRecord("checksum mismatch")
    if version != RECORD_VERSION or codec not in CODECS:
        raise CorruptRecord(f"unknown record version {version} / codec {codec}")
    if not (weight > 0) or weight == float("inf"):
        raise CorruptRecord("weight not finite and > 0")
    return SeqHeader(tick=tick, weight=weight, tokens=n, disk_bytes=len(value), codec=codec)


def peek(value: bytes | memoryview) -> SeqHeader | None:
    """What a record's header says, its checksum not verified (None if too short to hold a
    header): the token count a store keeps beside a record it copies as it is, corrupt or not."""
    if len(value) < HEADER_BYTES:
        return None
    _magic, _version, codec, _res, tick, weight, n = _HEAD.unpack_from(value)
    return SeqHeader(tick=tick, weight=weight, tokens=n, disk_bytes=len(value), codec=codec)


def peek_tokens(value: bytes | memoryview) -> int:
    """`peek`'s token count (0 without a header)."""
    head = peek(value)
    return 0 if head is None else head.tokens


def decode(value: bytes | memoryview) -> tuple[SeqHeader, np.ndarray]:
    """(header, int32 tokens) of a record; raises CorruptRecord."""
    head, tokens, _ = decode_with_probs(value)
    return head, tokens


def decode_with_probs(value: bytes | memoryview, head: SeqHeader | None = None) -> tuple[SeqHeader, np.ndarray, np.ndarray | None]:
    """(header, int32 tokens, float32 probabilities or None for codec 1) of a record; raises
    CorruptRecord. `head`: what `check(value)` already returned (its checksum is not redone)."""
    head = check(value) if head is None else head
    size = (5 if head.codec == CODEC_ZSTD_PLANES_PROBS else 4) * head.tokens
    try:
        planes = _dctx().decompress(bytes(memoryview(value)[HEADER_BYTES:]), max_output_size=size)
    except zstandard.ZstdError as e:
        raise CorruptRecord(f"zstd: {e}") from None
    if len(planes) != size:
        raise CorruptRecord("decompressed length differs from the header")
    n = head.tokens
    tokens = np.frombuffer(planes, dtype=np.uint8, count=4 * n).reshape(4, -1).T.copy().view("<i4").reshape(-1)
    if tokens.size and int(tokens.min()) < 0:
        raise CorruptRecord("token id out of range")
    if head.codec != CODEC_ZSTD_PLANES_PROBS:
        return head, tokens, None
    raw = np.frombuffer(planes, dtype=np.uint8, offset=4 * n)
    return head, tokens, np.where(raw == PROB_UNKNOWN, np.float32(np.nan), raw.astype(np.float32) / PROB_STEPS)


def restamp(value: bytes | memoryview, tick: int, weight: float) -> bytes:
    """A valid record with a new tick and weight and the same payload (not decompressed);
    raises CorruptRecord if `value` is not valid itself."""
    if not (weight > 0) or weight == float("inf"):
        raise ValueError(f"weight must be finite and > 0, got {weight}")
    old = check(value)
    payload = bytes(memoryview(value)[HEADER_BYTES:])
    head = _HEAD.pack(MAGIC, RECORD_VERSION, old.codec, 0, tick, weight, old.tokens)
    return head + _CRC.pack(zlib.crc32(payload, zlib.crc32(head))) + payload
