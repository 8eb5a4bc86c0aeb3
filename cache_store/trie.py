"""The per-prompt token tree: every continuation earlier rollouts produced, with counts.

A `TokenTree` is a suffix trie of bounded depth D (`max_depth`, default 64): inserting a sequence
counts every substring of length <= D, so the continuation of any position can be matched.
`count(path)` is how often `path` occurred (fractional after decay). Drafting finds the longest
tail of the context that is a path with children and follows the children with the highest
C(v) = count(v) / (sum of the counts of v and its siblings); see docs/cache.md, "The tree", for
the exact rules (match cap, ties, threshold, draft tree order, decay, bytes format).

The work happens in the compiled core `cache_store._trie` (C sources in cache_store/csrc/,
built by `pip install -e .` through setup.py); this module is the typed face of it. It is the
run-wide shared tree and the suffix drafter's tree (`stream().extend`, `draft`, `draft_tree`),
and the reference the suffix tree (cache_store.suffix_tree) is tested against; it is not
persisted any more (the cache stores rollouts: cache_store.seqstore).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

try:
    from cache_store import _trie
except ImportError as e:  # pragma: no cover - only in a checkout that was never built
    raise ImportError(
        "cache_store._trie (the compiled token tree) is not built: run `pip install -e .` "
        "in the srt checkout (needs a C compiler and the Python headers)"
    ) from e

FORMAT_VERSION: int = _trie.FORMAT_VERSION
MAX_DEPTH_LIMIT: int = _trie.MAX_DEPTH_LIMIT


@dataclass(slots=True)
class Draft:
    """A greedy draft: `tokens[i]` was chosen with conditional frequency `probs[i]` (C of that
    node); `match_len` is the length of the context tail it was drafted from (0: no match)."""

    tokens: list[int]
    probs: list[float]
    match_len: int


@dataclass(slots=True)
class DraftTree:
    """A best-first draft tree: node i is `tokens[i]`, child of node `parents[i]` (-1: child of
    the matched context), with conditional frequency `probs[i]`. Parents precede children, and
    nodes come in order of decreasing path score (product of C along the path)."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]
    match_len: int


class TreeStream:
    """Incremental insertion of one sequence: `extend(chunk)` inserts the new tokens and every
    suffix (up to max_depth) ending at each of them, exactly as inserting the whole sequence at
    once would. Several streams may be open on one tree."""

    __slots__ = ("_s",)

    def __init__(self, core_stream: object) -> None:
        self._s = core_stream

    def extend(self, tokens: Iterable[int]) -> None:
        """Insert `tokens` (ints in [0, 2**31); ValueError otherwise, with nothing inserted)."""
        self._s.extend(tokens)


class TokenTree:
    """A depth-bounded suffix trie over token ids with float counts (see the module docstring)."""

    __slots__ = ("_t",)

    def __init__(self, max_depth: int = 64) -> None:
        self._t = _trie.Tree(max_depth)

    @classmethod
    def _wrap(cls, core: object) -> "TokenTree":
        tree = cls.__new__(cls)
        tree._t = core
        return tree

    # -- building ---------------------------------------------------------------------------
    def insert(self, tokens: Iterable[int]) -> None:
        """Add one whole sequence: every substring of length <= max_depth gains 1."""
        self._t.insert(tokens)

    def stream(self) -> TreeStream:
        """A stream for inserting one sequence chunk by chunk as its tokens are verified."""
        return TreeStream(self._t.stream())

    # -- queries ----------------------------------------------------------------------------
    def count(self, path: Iterable[int]) -> float:
        """How often `path` occurred (after decay); 0.0 if absent; `mass` for the empty path."""
        return self._t.count(path)

    def draft(self, context: Sequence[int], budget: int = 16, min_prob: float = 0.1) -> Draft:
        """Greedy draft of at most `budget` tokens continuing `context` (see docs/cache.md)."""
        tokens, probs, match_len = self._t.draft(context, budget, min_prob)
        return Draft(tokens, probs, match_len)

    def draft_tree(self, context: Sequence[int], budget: int = 16, min_prob: float = 0.1) -> DraftTree:
        """Best-first draft tree of at most `budget` nodes continuing `context`."""
        tokens, parents, probs, match_len = self._t.draft_tree(context, budget, min_prob)
        return DraftTree(tokens, parents, probs, match_len)

    @property
    def nodes(self) -> int:
        """Number of nodes, the root excluded."""
        return self._t.nodes

    @property
    def mass(self) -> float:
        """Count mass: tokens inserted, after decay (the sum of depth-1 counts)."""
        return self._t.mass

    @property
    def max_depth(self) -> int:
        return self._t.max_depth

    def memory_bytes(self) -> int:
        """Bytes held by the node table and its hash map (allocated capacity)."""
        return self._t.memory_bytes()

    # -- decay, merge, persistence ----------------------------------------------------------
    def scale(self, factor: float, floor: float = 0.0) -> None:
        """Multiply every count by `factor`; drop nodes whose count is then < `floor` (or 0),
        with their subtrees."""
        self._t.scale(factor, floor)

    def merge(self, other: "TokenTree") -> None:
        """Add `other`'s counts into this tree (same max_depth, else ValueError)."""
        if not isinstance(other, TokenTree):
            raise TypeError(f"merge() needs a TokenTree, got {type(other).__name__}")
        self._t.merge(other._t)

    def copy(self) -> "TokenTree":
        return TokenTree._wrap(self._t.copy())

    def to_bytes(self) -> bytes:
        """The node table, uncompressed and canonical (equal trees give equal bytes)."""
        return self._t.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> "TokenTree":
        """Rebuild a tree from `to_bytes` output; ValueError on anything malformed."""
        return cls._wrap(_trie.Tree.from_bytes(data))

    def __reduce__(self) -> tuple:
        return (TokenTree.from_bytes, (self.to_bytes(),))

    def __repr__(self) -> str:
        return f"TokenTree(max_depth={self.max_depth}, nodes={self.nodes}, mass={self.mass:g})"
