"""Errors raised by the cache store.

`cache_store` never imports click or torch, so these are plain exceptions; the CLI
(srtcli.cli.cache) turns every `CacheError` into a one-line `SrtError` (exit 1).
"""

from __future__ import annotations


class CacheError(Exception):
    """Something about a cache the user can fix (message names its directory, or its URL with
    the password masked)."""


class NotACacheError(CacheError):
    """The directory is missing, or holds something that is not an srt cache."""


class OldFormatError(NotACacheError):
    """The directory holds srt's earlier tree-format cache (one trie per prompt).

    Its per-node counts cannot be turned back into the rollouts the sequence store keeps,
    so it is refused, never converted: the message says how to rebuild it.
    """


class FormatVersionError(CacheError):
    """The cache was written by a newer srt (a format this code cannot read)."""


class CacheBusyError(CacheError):
    """An operation that needs the cache to itself (compaction) found other users."""


class CorruptRecord(ValueError):
    """A stored sequence record failed its checksum or could not be decoded."""


class CorruptSequenceWarning(UserWarning):
    """A sequence record was skipped because it is corrupt (drafting goes on without it)."""


class CacheUnavailable(CacheError):
    """The cache server cannot be reached, or the connection to it was lost (message: the URL,
    password masked, and the reason)."""


class NetworkFilesystemError(CacheError):
    """An LMDB cache was asked for on a network or FUSE filesystem, where LMDB's locking and
    memory map are not safe; a cache server (a `redis://` URL) is the way to share one."""
