"""The token trees one run drafts from, per prompt: each prompt's tree and the run-wide tree,
held by the run's tree session (`srtcli.rollout.tree_session.TreeSession`, which also decides
what reaches the store and when), behind the embedded `srt` drafter and the vLLM proposer alike.

When a prompt is first needed its tree is built from the store (`StoreLink.stored`: the
prompt's newest stored rollouts, weighted by their decay) or started empty, with a flag saying
whether the store held sequences for it (a hit). Every token a sample of the prompt appends
goes at once into that tree (a `SuffixTree` stream), so later and concurrent samples draft from
it, and into the run-wide shared tree (all prompts mixed, never persisted; a suffix tree too).
Each sequence is streamed starting with the prompt's last token (an anchor), so it can be
drafted from its first token; a prompt's tree remembers the streams this run started
(`PromptTree.started`), which is what the session stores.

Loads off the step (`load_steps` > 0, the vLLM proposer's default): a build costs ~0.5-1 us per
stored token (~50 ms for 16 stored 8,192-token rollouts) and the proposer runs inside vLLM's step,
so a prompt's stored sequences are read when it is first needed (a bounded read, ~1 ms) and its
tree is built in a thread without the GIL (during the model's forwards, beside other prompts'
builds), the group streaming into an empty tree meanwhile. `adopt`, called once per step, moves
each group onto its built tree `load_steps` steps after its load began (waiting for the build
if it is not done): its streams so far re-stream there. The schedule is fixed, so drafts never
depend on timing; a new group's first `load_steps` steps draft without its stored sequences.
Small loads are not worth those steps: each step still builds up to `inline_tokens` stored
tokens itself (a few ms), first come first built. The run-wide tree's rebuild on long runs
(`bound_shared`) goes off the step the same way.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cache_store.store import LOAD_NEWEST, LOAD_TOKENS, TREE_DEPTH
from cache_store.suffix_tree import SuffixTree

SHARED_DEPTH = 24  # the run-wide tree: SuffixDecoding's global-tree depth
SHARED_MAX_TOKENS = 1 << 21  # then the run-wide tree starts again from its newest sequences
SHARED_MAX_SEQUENCES = 1 << 18  # or then: short outputs would fill its sequence table first
SHARED_KEEP = 1 << 18  # tokens of the newest sequences a new run-wide tree starts with
# a suffix tree holds at most 524,287 sequences: a prompt's tree loads its newest GROUP_KEEP,
# and a long-lived vLLM server starts it again from them once it holds GROUP_MAX_SEQUENCES, or
# GROUP_MAX_TOKENS tokens (~250 MB; long outputs of a prompt that is never idle)
GROUP_MAX_SEQUENCES, GROUP_KEEP, GROUP_MAX_TOKENS = 1 << 18, LOAD_NEWEST, 1 << 21
LOAD_STEPS = 4  # a load off the step is adopted this many steps after it began (the vLLM proposer's default)
LOAD_THREADS = 8  # prompt trees built at once
LOAD_INLINE_TOKENS = 8192  # stored tokens a step with loads off it still builds itself
# the run-wide tree's rebuild off the step (0.1-0.35 s of build) is adopted this many steps
# later: ~1-1.5 s of 15-25 ms steps, so the step that adopts it need not wait (the old tree
# drafts meanwhile)
SHARED_REBUILD_STEPS = 64

log = logging.getLogger("srt")


def newest_sequences(tree: SuffixTree, sequences: int, tokens: int) -> list[tuple]:
    """`tree`'s newest sequences, oldest first, as (tokens, weight 1, probs): at most `sequences`
    of them and `tokens` tokens in all (live ones as they are now), what a tree that starts
    again holds. Live streams keep feeding and drafting from the old tree until they end."""
    keep, left, n = [], tokens, tree.sequences
    for i in range(n - 1, max(n - 1 - sequences, -1), -1):
        toks = tree.sequence(i)
        if len(toks) > left:
            break
        keep.append((toks, 1.0, tree.sequence_probs(i)))
        left -= len(toks)
    return keep[::-1]



@dataclass
class PromptTree:
    """One prompt's tree while the run works on it (its group of samples streaming into it)."""

    tree: SuffixTree  # the store's sequences plus everything this run streamed into it
    hit: bool  # the store held sequences for the prompt when it was first needed
    started: list = field(default_factory=list)  # the streams this run started in `tree`, not yet stored
    grouped: bool = False  # a driver's group: its sequences are stored together
    counted: bool = False  # counted in `loaded`/`hits`
    loading: Future | None = None  # the stored tree being built off the step, until `adopt`
    due: int = 0  # the step that adopts it
    moving: list = field(default_factory=list)  # the streams opened on `tree` meanwhile

    def new_sequences(self) -> list:
        """The tokens of the sequences this run started (anchor first), as they are now."""
        return [self.tree.sequence(s.sequence_id) for s in self.started]

    def new_probs(self) -> list:
        """Their tokens' probabilities (None for a sequence streamed without them)."""
        return [self.tree.sequence_probs(s.sequence_id) for s in self.started]


class PromptTrees:
    """The prompts' trees in memory, the run-wide tree, and the hit counts, loaded through
    `link` (a `srtcli.store_link.StoreLink`; None: trees start empty)."""

    inline_tokens = LOAD_INLINE_TOKENS

    def __init__(self, link: Any = None, shared: bool = True, load_tokens: int = LOAD_TOKENS,
                 load_steps: int = 0):
        self.link, self.load_tokens = link, load_tokens
        self.shared = SuffixTree(SHARED_DEPTH) if shared else None
        self.groups: dict[str, PromptTree] = {}
        self.loaded = self.hits = 0
        self.load_steps, self.step, self.inline_used = load_steps, 0, 0
        self.loader: ThreadPoolExecutor | None = None  # made on the first load off the step
        self.loading: list[PromptTree] = []  # groups whose stored tree is being built
        self.shared_next: tuple[Future, int] | None = None  # the run-wide tree being rebuilt, its due step

    def group(self, uid: str) -> PromptTree:
        """The group's tree, loaded from the store the first time the prompt is needed (`_load`)."""
        g = self.groups.get(uid)
        if g is None:
            g = self.groups[uid] = self._load(uid)
        return g

    def _load(self, uid: str) -> PromptTree:
        """The prompt's group, a hit if the store held sequences for it: its tree of its newest
        stored sequences (at most LOAD_NEWEST of them and `load_tokens` tokens), built in the
        step or off it as `_group` decides."""
        if self.link is None:
            return PromptTree(SuffixTree(TREE_DEPTH), False)
        seqs = self.link.stored(uid, self.load_tokens)
        return self._group(seqs, bool(seqs))

    def _group(self, seqs: list, hit: bool) -> PromptTree:
        """A group whose tree holds `seqs`: built in the step when `load_steps` is 0 or it fits
        the step's inline budget, else off it (`adopt`)."""
        size = sum(len(s[0]) for s in seqs)
        if self.load_steps == 0 or size <= self.inline_tokens - self.inline_used:
            self.inline_used += size
            return PromptTree(SuffixTree.from_sequences(seqs, TREE_DEPTH), hit)
        g = PromptTree(SuffixTree(TREE_DEPTH), hit, loading=self._build(seqs, TREE_DEPTH), due=self.step + self.load_steps)
        self.loading.append(g)
        return g

    def restart(self, uid: str, g: PromptTree) -> PromptTree:
        """The prompt's group started again from `g`'s newest sequences (at most GROUP_KEEP of them
        and `load_tokens` tokens, as a load keeps), built as a load is; `g`'s live and waiting
        sequences stay with it and commit from it."""
        new = self.groups[uid] = self._group(newest_sequences(g.tree, GROUP_KEEP, self.load_tokens), g.hit)
        new.counted, new.grouped = g.counted, g.grouped
        return new

    def _build(self, seqs: list, depth: int) -> Future:
        """A tree of `seqs` built in a loader thread (`SuffixTree.from_sequences` releases the GIL)."""
        self.loader = self.loader or ThreadPoolExecutor(LOAD_THREADS, "srt-load")
        return self.loader.submit(SuffixTree.from_sequences, seqs, depth)

    def adopt(self) -> None:
        """A new step: every group whose load began `load_steps` steps ago moves onto its built tree
        (waiting for the build if need be): its streams so far, live and finished, continue there.
        A build that failed, or a move that ran out of memory, is logged and the group keeps
        drafting from what it streamed. The run-wide tree's rebuild (`bound_shared`) is adopted
        alike: new streams go to it."""
        self.step, self.inline_used = self.step + 1, 0
        if self.shared_next is not None and self.shared_next[1] <= self.step:
            built, self.shared_next = self.shared_next[0], None
            try:
                self.shared = built.result()
            except Exception as e:  # noqa: BLE001 - logged: the run-wide tree is only a draft source
                log.error("srt: cannot rebuild the run-wide tree: %s", e)
        due = [g for g in self.loading if g.due <= self.step]
        self.loading = [g for g in self.loading if g.due > self.step]
        for g in due:
            try:
                tree = g.loading.result()
            except Exception as e:  # noqa: BLE001 - logged: the cache must never stop a rollout
                log.error("srt: cannot build a prompt's tree from the cache: %s", e)
            else:
                self._move(g, tree)
            g.loading, g.moving = None, []

    def _move(self, g: PromptTree, tree: SuffixTree) -> None:
        """Move the group's streams onto its built `tree`. If memory runs out part way, the
        streams already moved go back and the group drafts on from what it streamed (logged),
        so a group never ends up split over two trees and commits every sequence whole. The
        streams that went back then hold their prefix twice in the group's tree, which only
        shifts its drafts' frequencies."""
        moved = []
        try:
            for stream in g.moving:
                stream.move(tree)
                moved.append(stream)
        except MemoryError as e:
            log.error("srt: no memory to move a prompt's group onto its stored tree (%s): it drafts on "
                      "from what it streamed", e)
            for stream in moved:
                stream.move(g.tree)
        else:
            g.tree = tree

    def count(self, g: PromptTree) -> None:
        """Count a group (once) in the loaded groups and cache hits."""
        if not g.counted:
            g.counted = True
            self.loaded += 1
            self.hits += g.hit

    def streams(self, g: PromptTree, anchor: int) -> tuple:
        """Streams into the group's tree and the shared tree, fed `anchor` (the prompt's last
        token) first."""
        stream = g.tree.stream()
        g.started.append(stream)
        if g.loading is not None:
            g.moving.append(stream)
        streams: tuple = (stream,) if self.shared is None else (stream, self.shared.stream())
        for s in streams:
            s.extend([anchor])
        return streams

    def bound_shared(self) -> None:
        """Keep the run-wide tree's memory bounded on long runs: past SHARED_MAX_TOKENS tokens or
        SHARED_MAX_SEQUENCES sequences it starts again from its newest (`newest_sequences`),
        once per SHARED_MAX_TOKENS tokens (or sequences) generated. That build (0.1-0.35 s at
        SHARED_KEEP tokens) is made in the step when `load_steps` is 0, else off it like a load:
        `adopt` swaps it in SHARED_REBUILD_STEPS steps later."""
        shared = self.shared
        if shared is None or self.shared_next is not None or \
                (shared.tokens <= SHARED_MAX_TOKENS and shared.sequences <= SHARED_MAX_SEQUENCES):
            return
        seqs = newest_sequences(shared, SHARED_MAX_SEQUENCES // 4, SHARED_KEEP)
        if self.load_steps == 0:
            self.shared = SuffixTree.from_sequences(seqs, shared.max_depth)
        else:
            self.shared_next = (self._build(seqs, shared.max_depth), self.step + SHARED_REBUILD_STEPS)
