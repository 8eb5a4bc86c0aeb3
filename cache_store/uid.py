"""Prompt uids: the LMDB key of a prompt's tree.

A uid hashes the prompt's token ids *and* the tokenizer's fingerprint, so the same ids
under two tokenizers (which mean different text) never share a tree. The hash is
BLAKE2b-128 over an unambiguous byte string: the fingerprint's length and bytes, then
the ids as little-endian uint32. The uid is its 32 lowercase hex digits.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from typing import Sequence

UID_HEX_LEN = 32
_PERSON = b"srt.prompt.v1"  # domain separation: no other srt hash can collide with a uid


def prompt_uid(prompt_ids: Sequence[int], tokenizer_fingerprint: str) -> str:
    """The uid of a prompt (its token ids) under a tokenizer (its fingerprint).

    Raises ValueError for an empty fingerprint or an id outside [0, 2**32).
    """
    if not isinstance(tokenizer_fingerprint, str) or not tokenizer_fingerprint:
        raise ValueError("a tokenizer fingerprint must be a non-empty string")
    fp = tokenizer_fingerprint.encode()
    try:
        ids = array("I", prompt_ids)  # 'I' is 4 bytes on every platform srt supports
    except (OverflowError, TypeError):
        raise ValueError("prompt ids must be integers in [0, 2**32)") from None
    if sys.byteorder == "big":  # pragma: no cover - the hash is defined little-endian
        ids.byteswap()
    h = hashlib.blake2b(digest_size=16, person=_PERSON[:16])
    h.update(struct.pack("<I", len(fp)))
    h.update(fp)
    h.update(ids.tobytes())
    return h.hexdigest()


def is_uid(text: str) -> bool:
    """Whether `text` looks like a uid (32 lowercase hex digits)."""
    return len(text) == UID_HEX_LEN and all(c in "0123456789abcdef" for c in text)
