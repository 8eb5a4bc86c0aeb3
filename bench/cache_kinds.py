"""The three trees `bench/cache_bench.py --scale` compares, behind one small interface.

- `trie`: the `TokenTree` of earlier srt versions, in memory only. Its store (`CacheStore`,
  one zstd trie record per prompt) has been removed: its load, commit and disk figures are the
  recorded ones in docs/benchmarks.md, so the store rows and the replay show "-" for it;
- `new`: the `SuffixTree` persisted by the sequence store (a commit appends the responses);
- `new-p`: `new` with the policy's probability of every token (p-hat) in the tree and in the
  store (record codec 2), as `srt rollout` keeps them when it samples; the probabilities are
  synthetic (`cache_scale.token_probs`);
- `arctic`: ArcticInference's suffix tree (`pip install '.[bench]'`), persisted the same way
  as `new` (it has no store of its own), drafting with `speculate(max_spec_tokens=16)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

KINDS = ("trie", "new", "new-p", "arctic")
DEPTH = 64
BUDGET = 16
MIN_PROB = 0.1


class Trie:
    persists = False  # no store any more: measured in memory only

    def __init__(self) -> None:
        from cache_store.trie import TokenTree

        self.T = TokenTree
        self.tree = TokenTree(DEPTH)

    def prepare(self, chunks: list[list[int]]) -> list:
        """What `stream_all` takes for one response's chunks (made before the timed insert)."""
        return chunks

    def stream_all(self, chunks: list[list[int]]) -> None:
        s = self.tree.stream()
        for c in chunks:
            s.extend(c)

    def memory_bytes(self) -> int:
        return self.tree.memory_bytes()

    def trim(self) -> None:
        if hasattr(self.tree, "trim"):
            self.tree.trim()

    def draft(self, ctx: list[int]) -> Any:
        return self.tree.draft(ctx, BUDGET, MIN_PROB)

    def draft_tree(self, ctx: list[int]) -> Any:
        return self.tree.draft_tree(ctx, BUDGET, MIN_PROB)


class New(Trie):
    persists = True

    def __init__(self) -> None:
        from cache_store.suffix_tree import SuffixTree

        self.T = SuffixTree
        self.tree = SuffixTree(DEPTH)

    def stream_all(self, chunks: list[list[int]]) -> None:
        s = self.tree.stream()
        for c in chunks:
            s.extend(c)
        s.close()

    def open_store(self, path: str) -> Any:
        from cache_store.seqstore import LmdbSequenceStore

        return LmdbSequenceStore.open(path)

    def _probs(self, tokens: list[int] | np.ndarray) -> list[float] | None:
        """The probabilities stored with these tokens: none here (`NewP` has them)."""
        return None

    def commit_responses(self, store: Any, uid: str, responses: list[np.ndarray]) -> None:
        store.append_many({self._uid(uid): responses}, {self._uid(uid): [self._probs(r) for r in responses]})

    def load(self, store: Any, uid: str) -> None:
        from cache_store.seqstore import load_tree

        self.tree = load_tree(store, self._uid(uid), DEPTH)

    def disk_bytes(self, store: Any, uid: str) -> int:
        return store.stats(verify=False).record_bytes

    def close_store(self, store: Any) -> None:
        store.close()

    @staticmethod
    def _uid(uid: str) -> str:
        return uid.encode().hex().ljust(32, "0")[:32]

    def begin_group(self, store: Any, uid: str) -> Any:
        self.load(store, uid)
        return self.tree

    def open_sample(self, group: Any) -> Any:
        return group.stream()

    def extend_sample(self, sample: Any, tokens: list[int]) -> None:
        sample.extend(tokens, self._probs(tokens))

    def draft_in(self, group: Any, sample: Any, ctx: list[int]) -> list[int]:
        return sample.draft(BUDGET, MIN_PROB).tokens  # matched from the stream's own windows

    def end_group(self, store: Any, uid: str, group: Any, samples: list, responses: list) -> None:
        for s in samples:
            s.close()
        ids = [s.sequence_id for s in samples]
        store.append_many({self._uid(uid): [group.sequence(i) for i in ids]},
                          {self._uid(uid): [group.sequence_probs(i) for i in ids]})


class NewP(New):
    """`New` storing p-hat: streamed with each chunk's probabilities, committed with them."""

    POOL = 1 << 20

    def __init__(self) -> None:
        from bench.cache_scale import token_probs

        super().__init__()
        # drawn once, handed out in turn: the timed work is the tree's and the store's, not the draw
        self.pool, self.at = token_probs(np.random.default_rng(5), self.POOL + 65_536), 0

    def _probs(self, tokens: list[int] | np.ndarray) -> list[float]:
        n = len(tokens)
        if self.at + n > len(self.pool):
            self.at = 0
        self.at += n
        return self.pool[self.at - n:self.at].tolist()

    def prepare(self, chunks: list[list[int]]) -> list:
        return [(c, self._probs(c)) for c in chunks]

    def stream_all(self, chunks: list) -> None:
        s = self.tree.stream()
        for c, p in chunks:
            s.extend(c, p)
        s.close()


class Arctic(New):
    def __init__(self) -> None:
        from arctic_inference.suffix_decoding._C import SuffixTree

        self.A = SuffixTree
        self.tree = SuffixTree(DEPTH)
        self.next_id = 0

    def stream_all(self, chunks: list[list[int]]) -> None:
        sid, self.next_id = self.next_id, self.next_id + 1
        for c in chunks:
            self.tree.extend(sid, c)

    def memory_bytes(self) -> int:
        return self.tree.estimate_memory()

    def draft(self, ctx: list[int]) -> Any:
        return self.tree.speculate(ctx, BUDGET, 1000.0, 0.0, MIN_PROB, False)

    def draft_tree(self, ctx: list[int]) -> Any:
        return self.tree.speculate(ctx, BUDGET, 1000.0, 0.0, MIN_PROB, True)

    def load(self, store: Any, uid: str) -> None:
        self.tree, self.next_id = self.A(DEPTH), 0
        for s in store.read(self._uid(uid)):
            self.stream_all([s.tokens.tolist()])

    def begin_group(self, store: Any, uid: str) -> Any:
        self.load(store, uid)
        return self

    def open_sample(self, group: Any) -> Any:
        sid, self.next_id = self.next_id, self.next_id + 1
        return [sid, []]

    def extend_sample(self, sample: Any, tokens: list[int]) -> None:
        self.tree.extend(sample[0], tokens)
        sample[1].extend(tokens)

    def draft_in(self, group: Any, sample: Any, ctx: list[int]) -> list[int]:
        return list(self.draft(ctx).token_ids)

    def end_group(self, store: Any, uid: str, group: Any, samples: list, responses: list) -> None:
        store.append(self._uid(uid), [s[1] for s in samples])


def make_kind(kind: str, probe: bool = False) -> Any:
    """A fresh instance of `kind`; with `probe`, only whether it can be made (installed)."""
    if probe:
        if kind != "arctic":
            return True
        try:
            import arctic_inference.suffix_decoding._C  # noqa: F401
        except ImportError:
            return False
        return True
    return {"trie": Trie, "new": New, "new-p": NewP, "arctic": Arctic}[kind]()
