"""Record keys: how every backend names one stored sequence.

A key is the prompt's uid (32 lowercase hex digits, ASCII) followed by the record's number as
an unsigned 32-bit big-endian integer. A prompt's records therefore sort together and in append
order: LMDB walks them with one cursor, and the Redis store builds the same keys for what it
reads, so the records of stores of both backends compare byte for byte.
"""

from __future__ import annotations

import struct

NUMBER = struct.Struct(">I")
LAST_NUMBER = 0xFFFFFFFF


def record_key(uid: str | bytes, n: int) -> bytes:
    """The key of record `n` of the prompt `uid`."""
    return (uid.encode() if isinstance(uid, str) else bytes(uid)) + NUMBER.pack(n)


def key_prompt(key: bytes) -> bytes:
    """The uid part of a record key, as bytes (LMDB's meta records are keyed by it)."""
    return bytes(key[:-NUMBER.size])


def key_uid(key: bytes) -> str:
    """The prompt uid of a record key."""
    return key_prompt(key).decode(errors="replace")


def key_number(key: bytes) -> int:
    """The record number of a record key."""
    return NUMBER.unpack(bytes(key[-NUMBER.size:]))[0]
