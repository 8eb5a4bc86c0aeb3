"""A run's prompt trees and their persistence, owned by one object: the tree session.

Every drafting path calls only this: the embedded `srt` drafter (`srt rollout`, the TRL
rollout function) and the vLLM proposer (driven by `srt rollout --engine vllm`, or dropped into
any vLLM). Its lifecycle, SuffixDecoding's start / add / speculate / stop plus the batch:

    session = TreeSession.open(location)           # the driver, the TRL rollout, the proposer
    g = session.hold(uid)                          # a driver's group of the prompt begins
    g, streams = session.start_sequence(uid, anchor)   # one sequence of it: its streams
    stream.extend(tokens, probs)                   # the caller feeds them and drafts from them
    session.stop_sequence(streams[0])              # it ended
    session.release(uid)                           # the driver's group is done
    session.step()                                 # a new engine step (the vLLM proposer)
    session.commit_if_due()                        # where the caller's path checks the rule
    session.end_batch()                            # a rollout batch ended: append, then tick
    session.close()                                # append what is left, close the store

The trees are `PromptTrees` (each prompt's tree, loaded from the store the first time it is
needed, and the run-wide tree); the store is reached through a `StoreLink` (bounded loads,
queued appends, the clock, a lost server's retries). A sequence's tokens are taken when it
stops, never read later through a callback. A prompt a driver holds (a group of K samples)
has its sequences taken together when it is released and its last sequence has stopped, in the
order they started, so each group is stored whole and in order; a prompt nobody holds (a vLLM
request) has each sequence taken when it stops.

One commit rule for every path: what is queued is appended once `commit_every` sequences wait
or the oldest has waited `commit_seconds` (`due`: checked after each group a driver releases
and after each vLLM step, and by the proposer when vLLM is idle), at the end
of every rollout batch, before a prompt whose sequences are queued is loaded again (so the load
reads them back), and at close. A prompt's tree stays in memory while it is held or has live
sequences, and after that among the `idle_groups` most recently idle prompts (0 for a driver,
which knows its groups; the vLLM proposer keeps 64, for samples of a prompt that come later).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from cache_store.store import LOAD_TOKENS, TREE_DEPTH
from cache_store.suffix_tree import SuffixTree
from srtcli.rollout.drafters.prompt_trees import GROUP_MAX_SEQUENCES, GROUP_MAX_TOKENS, PromptTree, PromptTrees
from srtcli.store_link import StoreLink

COMMIT_EVERY = 64  # sequences per append
COMMIT_SECONDS = 2.0  # the longest a stopped sequence waits for its append

log = logging.getLogger("srt")


class TreeSession:
    """A run's prompt trees (`trees`), which of them stay in memory, and when what their
    sequences streamed reaches the store (`link`; None: trees live for the run only)."""

    def __init__(self, link: StoreLink | None = None, *, shared: bool = True, load_tokens: int = LOAD_TOKENS,
                 load_steps: int = 0, idle_groups: int = 0, commit_every: int = COMMIT_EVERY,
                 commit_seconds: float = COMMIT_SECONDS):
        self.link = link
        self.trees = PromptTrees(link, shared, load_tokens=load_tokens, load_steps=load_steps)
        self.idle_groups, self.commit_every, self.commit_seconds = idle_groups, commit_every, commit_seconds
        self.held: dict[str, int] = {}  # uid -> holds
        self.live: dict[str, int] = {}  # uid -> live sequences
        self.sequences: dict[int, tuple[str, PromptTree]] = {}  # id of a live sequence's stream -> its prompt
        self.idle: OrderedDict[str, None] = OrderedDict()  # uids neither held nor live, oldest first
        self.since = 0.0  # when the oldest queued sequence was queued

    @classmethod
    def open(cls, location: str | Path | None, *, writer: bool = True, spill_dir: str | Path | None = None,
             **settings: Any) -> "TreeSession":
        """A session over the cache at `location` (created if needed; a bad cache is one SrtError line)."""
        return cls(StoreLink.open(location, writer, spill_dir), **settings)

    # --- prompts and sequences ------------------------------------------------------------
    def hold(self, uid: str) -> PromptTree:
        """A driver's group of the prompt begins (or goes on): its tree stays until `release`."""
        g = self._resident(uid)
        g.grouped = True
        self.held[uid] = self.held.get(uid, 0) + 1
        return g

    def start_sequence(self, uid: str, anchor: int) -> tuple[PromptTree, tuple]:
        """A sequence of the prompt begins: the prompt's tree (loaded the first time) and its
        streams into it and the run-wide tree, fed `anchor` (the prompt's last token) first."""
        g = self._resident(uid)
        if uid not in self.held and (g.tree.sequences >= GROUP_MAX_SEQUENCES or g.tree.tokens > GROUP_MAX_TOKENS):
            g = self.trees.restart(uid, g)  # a server that sees one prompt very often
        self.live[uid] = self.live.get(uid, 0) + 1
        streams = self.trees.streams(g, anchor)
        self.sequences[id(streams[0])] = uid, g
        return g, streams

    def stop_sequence(self, stream: Any) -> None:
        """A sequence ended (`stream`: its stream in its prompt's tree, the first
        `start_sequence` gave): taken now unless its prompt's tree holds a driver's group, which
        is taken whole once released."""
        uid, g = self.sequences.pop(id(stream))
        if not g.grouped and stream in g.started:
            g.started.remove(stream)
            self._queue(uid, [g.tree.sequence(stream.sequence_id)], [g.tree.sequence_probs(stream.sequence_id)])
        self.live[uid] -= 1
        if self.live[uid] == 0:
            del self.live[uid]
            self._settle(uid)

    def release(self, uid: str) -> None:
        """A driver's group of the prompt is done."""
        self.held[uid] -= 1
        if self.held[uid] == 0:
            del self.held[uid]
            self._settle(uid)

    def count(self, g: PromptTree) -> None:
        """Count the prompt (once) in the loaded prompts and cache hits."""
        self.trees.count(g)

    # --- steps and batches ----------------------------------------------------------------
    def step(self) -> None:
        """A new engine step: the trees built off the step that are due now move in."""
        self.trees.adopt()

    def commit(self) -> bool:
        """Append what is queued now; True if an append ran. A failure never stops a rollout:
        it is logged (the link retries what a lost server did not take)."""
        if self.link is None or not self.link.waiting and not self.link.unsent:
            return False
        n = self.link.waiting
        try:
            return self.link.append()
        except Exception as e:  # noqa: BLE001 - logged: the cache must never stop a rollout
            log.error("srt: cannot append %d sequences to the cache %s: %s", n, self.link.path, e)
            return False

    @property
    def waiting(self) -> int:
        """Sequences queued for the next append."""
        return self.link.waiting if self.link is not None else 0

    def end_batch(self) -> None:
        """A rollout batch ended: what it wrote reaches the store, then the clock advances."""
        if self.link is not None:
            self.link.tick()

    def close(self) -> None:
        """Every prompt still in memory gives up what it streamed (a run-ahead tree of a prompt
        never reached, a group cut short); that is appended and the store closed."""
        for uid in list(self.trees.groups):
            self._take(uid)
        self.held.clear()
        self.live.clear()
        self.sequences.clear()
        self.trees.groups.clear()
        link, self.link = self.link, None
        if link is not None:
            link.close()

    # --- residency and commits ------------------------------------------------------------
    def _resident(self, uid: str) -> PromptTree:
        """The prompt's tree, in memory from now on (a store that cannot be read is logged and
        the tree starts empty). A prompt loaded again has what it queued appended first."""
        if uid not in self.trees.groups and self.link is not None and uid in self.link.queued.seqs:
            self.commit()
        try:
            g = self.trees.group(uid)
        except Exception as e:  # noqa: BLE001 - logged: the cache must never stop a rollout
            log.error("srt: cannot load prompt %s from the cache %s: %s", uid, self.link and self.link.path, e)
            g = self.trees.groups[uid] = PromptTree(SuffixTree(TREE_DEPTH), False)
        self.idle.pop(uid, None)
        return g

    def _settle(self, uid: str) -> None:
        """The prompt may be neither held nor live now: its group is taken, it turns idle, and
        the oldest idle prompts beyond `idle_groups` leave memory."""
        if uid in self.held or uid in self.live:
            return
        self._take(uid)
        self.idle[uid] = None
        self.trees.bound_shared()
        while len(self.idle) > self.idle_groups:
            self._forget(next(iter(self.idle)))

    def _take(self, uid: str) -> None:
        """Queue every sequence still held in the prompt's tree, in the order they started."""
        g = self.trees.groups.get(uid)
        if g is not None and g.started:
            self._queue(uid, g.new_sequences(), g.new_probs())
            g.started = []

    def _queue(self, uid: str, seqs: list, probs: list) -> None:
        if self.link is None:
            return
        if not self.link.waiting:
            self.since = time.monotonic()
        self.link.queue(uid, seqs, probs)

    def _forget(self, uid: str) -> None:
        """An idle prompt leaves memory."""
        self.idle.pop(uid, None)
        self.trees.groups.pop(uid, None)

    def due(self) -> bool:
        """Whether the commit rule says append now."""
        n = self.waiting
        return n > 0 and (n >= self.commit_every or time.monotonic() - self.since >= self.commit_seconds)

    def commit_if_due(self) -> bool:
        """Append if the commit rule says so; True if an append ran."""
        return self.due() and self.commit()
