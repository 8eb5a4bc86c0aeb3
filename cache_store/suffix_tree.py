"""The per-prompt token tree: weighted token sequences and their suffix tree, for drafting.

A `SuffixTree` holds weighted token sequences and, over them, every window s[i .. i+D) of
each (D = `max_depth`, default 64) as a path-compressed tree whose edges point into the
stored token arrays. `count(path)` is the weighted number of occurrences of `path` (length
<= D) as a substring of the stored sequences. Drafting finds the longest tail of the context
that is a path with children and follows the children with the highest C(v) = count(v) /
(sum of the counts of v and its siblings): `draft` greedily, `draft_tree` best-first. The
exact rules (match cap, ties, threshold, draft tree order) are in docs/cache.md, "Drafting";
tests/cache_store/reference_tree.py writes them out in plain Python, and the tests hold this
tree to it bit for bit when the weights are exact binary fractions.

Why path-compressed: a depth-bounded suffix *trie* holds up to D nodes per token (56 per
token on long reasoning rollouts); this tree holds about 1.6, and a sequence's decay is one
weight instead of a multiplication of every node, so persistence can store the sequences
themselves (cache_store.store) and rebuild the tree when loading.

For an engine step over many rows there are two batched calls, `feed_many` and `draft_many`:
one C call for all rows instead of a Python loop over them, its tree work without the GIL and
on several threads if asked (trees and drafts come out the same for any number of them).
`sample_draft` samples one row's draft from its tree in one call (the embedded engine's default
drafts); `merged_draft` gives one row's draft trees as one (the engine's tail trees).

Sequences come in two kinds: finished ones (`add(tokens, weight)`, e.g. loaded from a store,
weight = their decay) and live ones (`stream()`, weight 1, extended token by token or in
chunks as a rollout is verified; `close()` when it ends). Drafts see every token at once.
Nothing is ever removed: dropping sequences means building a new tree without them.

The compiled core is `cache_store._stree` (C sources cache_store/csrc/stree_*.c).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

try:
    from cache_store import _stree
except ImportError as e:  # pragma: no cover - only in a checkout that was never built
    raise ImportError(
        "cache_store._stree (the compiled suffix tree) is not built: run `pip install -e .` "
        "in the srt checkout (needs a C compiler and the Python headers)"
    ) from e

MAX_DEPTH_LIMIT: int = _stree.MAX_DEPTH_LIMIT

__all__ = ["Draft", "DraftTree", "SuffixTree", "SuffixStream", "TreeStats", "best_draft", "draft_many", "feed_many",
           "merged_draft", "pick_stream", "sample_draft"]


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


@dataclass(frozen=True, slots=True)
class TreeStats:
    """What a tree holds: sequences (live ones included), tokens, nodes, bytes allocated."""

    sequences: int
    live: int
    tokens: int
    nodes: int
    memory_bytes: int


class SuffixStream:
    """A live sequence: `extend(tokens)` appends tokens and puts every window ending at them
    into the tree at once; `close()` marks it finished (also done when it is garbage)."""

    __slots__ = ("_s",)

    def __init__(self, core_stream: object) -> None:
        self._s = core_stream

    def extend(self, tokens: Iterable[int], probs: Sequence[float] | None = None) -> None:
        """Append `tokens` (ints in [0, 2**31); ValueError otherwise, with nothing appended),
        with the probability the policy gave each (`probs`: one per token, in [0, 1], NaN for
        unknown; None: all unknown), which `sample_draft(..., stop=True)` drafts by. The tree
        keeps each in one byte, as the store's records do (within 0.002)."""
        self._s.extend(tokens, probs)

    def close(self) -> None:
        """The sequence is finished (idempotent); extending it afterwards raises ValueError."""
        self._s.close()

    def draft(self, budget: int = 16, min_prob: float = 0.1) -> Draft:
        """`tree.draft(this sequence so far, ...)`, without looking the context up: the
        stream's windows already hold the loci of its tails."""
        tokens, probs, match_len = self._s.draft(budget, min_prob)
        return Draft(tokens, probs, match_len)

    def draft_tree(self, budget: int = 16, min_prob: float = 0.1) -> DraftTree:
        """`tree.draft_tree(this sequence so far, ...)`, matched the same way as `draft`."""
        tokens, parents, probs, match_len = self._s.draft_tree(budget, min_prob)
        return DraftTree(tokens, parents, probs, match_len)

    def move(self, tree: "SuffixTree") -> None:
        """Continue in `tree`: the sequence so far goes into it as a new sequence (live, its
        windows streamed as if it had been streamed there from the start; or finished, if this
        stream is closed), and later tokens go there; in the old tree it is finished. Its
        `sequence_id` is then its id in `tree`."""
        self._s.move(tree._t)

    @property
    def sequence_id(self) -> int:
        return self._s.sequence

    @property
    def core(self) -> object:
        """The compiled stream, for `feed_many` and `draft_many`."""
        return self._s

    def __len__(self) -> int:
        return self._s.length


class SuffixTree:
    """Weighted token sequences and their depth-bounded suffix tree (see the module docstring)."""

    __slots__ = ("_t",)

    def __init__(self, max_depth: int = 64) -> None:
        self._t = _stree.SuffixTree(max_depth)

    @classmethod
    def from_sequences(cls, seqs: Iterable[tuple], max_depth: int = 64) -> "SuffixTree":
        """A tree holding each (tokens, weight) or (tokens, weight, probs) of `seqs`, trimmed. The
        build runs without the GIL once the sequences are read, so several threads build at once
        (how the vLLM proposer loads prompts off its step)."""
        tree = cls.__new__(cls)
        tree._t = _stree.build(seqs if isinstance(seqs, (list, tuple)) else list(seqs), max_depth)
        return tree

    def add(self, tokens: Iterable[int], weight: float = 1.0, probs: Sequence[float] | None = None) -> int:
        """Store one finished sequence with `weight` (finite, > 0) and its tokens' probabilities
        (as `SuffixStream.extend`); returns its id."""
        return self._t.add(tokens, weight, probs)

    def stream(self) -> SuffixStream:
        """A new live sequence (weight 1), extended as its tokens are verified."""
        return SuffixStream(self._t.stream())

    def count(self, path: Iterable[int]) -> float:
        """Weighted occurrences of `path` (0.0 if absent or longer than max_depth; `mass` for [])."""
        return self._t.count(path)

    def draft(self, context: Sequence[int], budget: int = 16, min_prob: float = 0.1) -> Draft:
        """Greedy draft of at most `budget` tokens continuing `context` (see the module docstring)."""
        tokens, probs, match_len = self._t.draft(context, budget, min_prob)
        return Draft(tokens, probs, match_len)

    def draft_tree(self, context: Sequence[int], budget: int = 16, min_prob: float = 0.1) -> DraftTree:
        """Best-first draft tree of at most `budget` nodes continuing `context`."""
        tokens, parents, probs, match_len = self._t.draft_tree(context, budget, min_prob)
        return DraftTree(tokens, parents, probs, match_len)

    def sequence(self, i: int) -> array:
        """The tokens of sequence `i` (so far, for a live one), as an int32 array (one copy)."""
        out = array("i")
        out.frombytes(self._t.sequence(i))
        return out

    def sequence_probs(self, i: int) -> array | None:
        """The probabilities stored with sequence `i` (float32 of the kept byte, NaN where
        unknown), or None when none is known."""
        raw = self._t.sequence_probs(i)
        if raw is None:
            return None
        out = array("f")
        out.frombytes(raw)
        return out

    @property
    def max_depth(self) -> int:
        return self._t.max_depth

    @property
    def mass(self) -> float:
        """Weighted tokens stored (the sum of the depth-1 counts)."""
        return self._t.mass

    @property
    def nodes(self) -> int:
        return self._t.nodes

    @property
    def sequences(self) -> int:
        """Sequences stored, live ones included (O(1), unlike `stats`)."""
        return self._t.sequences

    @property
    def tokens(self) -> int:
        """Tokens stored (O(1), unlike `stats`)."""
        return self._t.tokens

    def trim(self) -> None:
        """Give back the room growth reserved (after a bulk load; later appends regrow it)."""
        self._t.trim()

    def memory_bytes(self) -> int:
        """Bytes allocated: nodes, the child map, token arrays, stream windows."""
        return self._t.memory_bytes()

    def stats(self) -> TreeStats:
        t = self._t
        return TreeStats(t.sequences, t.live_streams, t.tokens, t.nodes, t.memory_bytes())

    def __repr__(self) -> str:
        s = self.stats()
        return f"SuffixTree(max_depth={self.max_depth}, sequences={s.sequences}, tokens={s.tokens}, nodes={s.nodes})"


def feed_many(streams: list[tuple], ids: Any, slots: Any, starts: Any, ends: Any, limits: Any, eos: Any,
              drafts: list[list[int]], threads: int = 1) -> tuple[list[int], list[int]]:
    """One step's new tokens for many rows. Row i holds `ids[slots[i], starts[i]:ends[i]]` new
    tokens (ids: a C-contiguous 2-d int32 or int64 array; the others 1-d int arrays); they are
    appended to each stream of `streams[i]` (a tuple of `SuffixStream.core`) up to position
    `limits[i]` and up to and including the first token in `eos`. Returns, per row, how many
    tokens were appended and how many of the new tokens `drafts[i]` (its last draft) predicted.

    The appends run without the GIL on up to `threads` threads (at most 16), one tree per
    thread at a time and each tree's rows in order: the trees end the same for any `threads`.
    Meanwhile no other thread may use these trees or their other streams (close one, or drop
    the last reference to it): the vLLM proposer makes both calls under its lock."""
    return _stree.feed_many(streams, ids, slots, starts, ends, limits, eos, drafts, threads)


def draft_many(streams: list[tuple], rooms: Any, min_prob: float, threads: int = 1) -> list[list[int]]:
    """Per row, `best_draft` of at most `rooms[i]` tokens over its streams (a tuple of
    `SuffixStream.core`, its prompt tree's first): each stream's greedy draft continuing its own
    sequence, the one with the largest expected accepted length (the first on ties); [] where
    the room is <= 0. The trees are read without the GIL, rows shared out to up to `threads`."""
    return _stree.draft_many(streams, rooms, min_prob, threads)


def pick_stream(streams: tuple, room: int, min_prob: float) -> int:
    """Which of a sequence's streams (a tuple of `SuffixStream`, its prompt tree's first) drafts
    for it: the one whose greedy draft of at most `room` tokens has the largest expected
    accepted length (the sum of its prefixes' path probabilities, C along the path), the first
    on ties; 0 when there is no room. The one rule every draft uses (`draft_many`,
    `sample_draft`, `merged_draft`, `best_draft`). It depends on the context and the trees only,
    so verification stays exact."""
    return _stree.pick_stream(tuple(s.core for s in streams), room, min_prob)


def best_draft(streams: tuple, budget: int, min_prob: float) -> tuple[SuffixStream, Draft]:
    """The stream `pick_stream` picks and its greedy draft (`SuffixStream.draft`)."""
    stream = streams[pick_stream(streams, budget, min_prob)]
    return stream, stream.draft(budget, min_prob)


def sample_draft(streams: tuple, budget: int, min_prob: float,
                 random: Callable[[], float],
                 stop: bool = False) -> tuple[list[int], list[float], list[dict[int, float]]]:
    """A draft sampled from a sequence's streams (a tuple of `SuffixStream`, its prompt tree's
    first): the stream `draft_many` would draft from walks its draft tree of 4 x `budget`
    nodes (`SuffixStream.draft_tree`) from the root, drawing each child in proportion to its
    frequency among the children the tree lists, for at most `budget` tokens. Each draw is
    `random.choices`' own rule over `random()`. Returns the tokens, the probability q each was
    drawn with, and the distribution each was drawn from ({token: q}).

    With `stop`, where every child listed has a known probability (p-hat: what the policy gave
    that token in the stored sequence the tree node points into), children are drawn by p-hat;
    the other streams' draft trees, walked along the same tokens, offer their children with a
    known p-hat that are not listed yet for the rest of the mass, 1 - sum p-hat (scaled down
    together if they would take more; a tree off the drawn path drops out, and the next one on
    it leads), and what is still left ends the draft: the draft then carries one distribution
    more than tokens, the (defective) q at the position after its last token, and the verifier
    samples the token there from the residual (p - q)+. Children of p-hat 0 (tool output) are
    never drafted. Where the policy is what wrote the tree, p-hat is close to p, so
    drafted tokens are nearly always accepted and a draft stops where it would have been
    rejected: fewer verified tokens wasted, the same output distribution."""
    return _stree.sample_draft(tuple(s.core for s in streams), budget, min_prob, random, stop)


def merged_draft(streams: tuple, nodes: int, min_prob: float) -> tuple[list[int], list[int]]:
    """One draft tree of at most `nodes` nodes from a sequence's streams (a tuple of
    `SuffixStream`): each stream's best-first draft tree of `nodes` nodes (`draft_tree`), the
    stream `draft_many` would draft from first, then the others in order, merged by path score
    (the product of C along the path; ties: the earlier tree, then the earlier node), a path
    already taken kept once; parents come before children. Where only one tree lists the
    policy's next token, the merged tree still offers it. Returns (tokens, parents), -1 for the
    root's children."""
    return _stree.merged_draft(tuple(s.core for s in streams), nodes, min_prob)
