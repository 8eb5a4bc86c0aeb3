"""Which prompt trees the vLLM proposer keeps in memory, and when its sequences reach the cache.

No driver says when a group of samples is done, so the proposer works per sequence. A prompt's
group (`GroupTrees`: its tree loaded from the store, or new) stays in memory while any of its
sequences is live, and after that among the `idle_groups` most recently idle groups, so samples
of the prompt that come later (more samples than the batch holds, the next epoch on the same
server) draft from the same tree, sequences not yet committed included.

A sequence is committed when it ends: it waits in the tree cache (`srtcli.tree_cache.TreeCache`)
and goes to the store in one `append_many` once `commit_every` are waiting or the oldest has
waited `commit_seconds` (checked at every engine step, and by the proposer when vLLM is idle),
and at the end of a rollout batch or of the process. An idle group leaving memory has its
waiting sequences appended first, so a later load of the prompt reads them back. What a killed worker loses is
the waiting sequences: each append is atomic (per prompt on a server), so the store is never
left half-written. A failed append never stops the server: the tree cache retries what a lost
server did not take and, if it is still gone at close, writes it to a local store for
`srt cache import`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict, deque
from typing import Any

from cache_store.store import TREE_DEPTH
from cache_store.suffix_tree import SuffixTree
from srtcli.rollout.drafters.group_trees import GROUP_MAX_SEQUENCES, GROUP_MAX_TOKENS, GroupTrees, PromptTree

COMMIT_EVERY = 64  # sequences per append
COMMIT_SECONDS = 2.0  # the longest an ended sequence waits (also: idle time before all is committed)
IDLE_GROUPS = 64  # prompt trees kept in memory after their last live sequence ended
EVERY_ENV, SECONDS_ENV = "SRT_VLLM_COMMIT_EVERY", "SRT_VLLM_COMMIT_SECONDS"
IDLE_GAPS = 4  # vLLM is idle after this many of its (slow) step intervals without a step

log = logging.getLogger("srt.vllm")


class ResidentTrees:
    """Which prompt trees stay in memory (the groups with live sequences, the idle ones kept) and
    when the ended sequences waiting in the cache are appended."""

    def __init__(self, trees: GroupTrees, commit_every: int = COMMIT_EVERY,
                 commit_seconds: float = COMMIT_SECONDS, idle_groups: int = IDLE_GROUPS):
        self.trees, self.commit_every, self.commit_seconds = trees, commit_every, commit_seconds
        self.idle_groups = idle_groups
        self.live: dict[str, int] = {}  # uid -> live sequences
        self.idle: OrderedDict[str, None] = OrderedDict()  # uids of groups with none, oldest first
        self.since = 0.0  # when the oldest waiting sequence ended

    def open(self, uid: str) -> PromptTree:
        """The prompt's group for one more live sequence (loaded the first time; a store that
        cannot be read is logged and the tree starts empty)."""
        try:
            g = self.trees.group(uid)
        except Exception as e:  # noqa: BLE001 - logged: the cache must never stop vLLM
            log.error("srt: cannot load prompt %s from the cache %s: %s", uid, self.trees.cache.path, e)
            g = self.trees.groups[uid] = PromptTree(SuffixTree(TREE_DEPTH), False)
        if g.tree.sequences >= GROUP_MAX_SEQUENCES or g.tree.tokens > GROUP_MAX_TOKENS:
            g = self.trees.restart(uid, g)  # a server that sees one prompt very often
        self.trees.count(g)
        self.idle.pop(uid, None)
        self.live[uid] = self.live.get(uid, 0) + 1
        return g

    def close(self, uid: str, g: PromptTree, stream: Any) -> None:
        """A sequence ended (`stream`: its stream in the group's tree, whose id changes if the group
        moves onto its loaded tree, so it is read when appended): it waits for the next append;
        its group may become idle."""
        cache = self.trees.cache
        if cache is not None:
            if not cache.waiting:
                self.since = time.monotonic()
            cache.wait(uid, lambda: ([g.tree.sequence(stream.sequence_id)], None))
        self.live[uid] -= 1
        if self.live[uid] == 0:
            del self.live[uid]
            self.idle[uid] = None
            self.trees.bound_shared()
            while len(self.idle) > self.idle_groups:
                self.forget(next(iter(self.idle)))

    def forget(self, uid: str) -> None:
        """Drop an idle group from memory, its waiting sequences appended first."""
        if self.trees.cache is not None and uid in self.trees.cache.pending:
            self.flush()
        self.idle.pop(uid, None)
        self.trees.groups.pop(uid, None)

    def due(self) -> bool:
        return bool(self.waiting) and (self.waiting >= self.commit_every
                                       or time.monotonic() - self.since >= self.commit_seconds)

    def flush(self) -> bool:
        """Append every waiting sequence in one transaction; True if one ran."""
        cache, n = self.trees.cache, self.waiting
        if cache is None:
            return False
        try:
            return cache.flush()
        except Exception as e:  # noqa: BLE001 - logged: the cache must never stop vLLM
            log.error("srt: cannot append %d sequences to the cache %s: %s", n, cache.path, e)
            return False

    @property
    def waiting(self) -> int:
        return self.trees.cache.waiting if self.trees.cache is not None else 0


class StepClock:
    """When vLLM last stepped, and when that means it is idle: `seconds` without a step, or
    `IDLE_GAPS` times its steps' interval if they are slower (the second longest of the last
    16: a pause between requests is one long interval, slow steps are many)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.intervals: deque[float] = deque(maxlen=16)

    def tick(self) -> None:
        """At the start and end of every step (the interval between is the model's step)."""
        now = time.monotonic()
        self.intervals.append(now - self.last)
        self.last = now

    def idle_after(self, seconds: float) -> float:
        slow = sorted(self.intervals)[-2] if len(self.intervals) > 1 else 0.0
        return max(seconds, IDLE_GAPS * slow)

    def idle(self, seconds: float) -> bool:
        return time.monotonic() - self.last >= self.idle_after(seconds)


def commit_settings() -> tuple[int, float]:
    """(sequences per append, seconds), from `$SRT_VLLM_COMMIT_EVERY` / `$SRT_VLLM_COMMIT_SECONDS`
    if set; a bad value is one SrtError line."""
    from srtcli.errors import SrtError

    every, seconds = os.environ.get(EVERY_ENV), os.environ.get(SECONDS_ENV)
    try:
        out = (int(every) if every else COMMIT_EVERY, float(seconds) if seconds else COMMIT_SECONDS)
    except ValueError:
        out = (0, 0.0)
    if out[0] < 1 or not out[1] > 0:
        raise SrtError(f"${EVERY_ENV} must be a whole number >= 1 and ${SECONDS_ENV} a number > 0 "
                       f"(got {every!r}, {seconds!r})")
    return out


def open_tree_cache(path: str | None, writer: bool) -> Any:
    """The tree cache at `path` (created if needed), or None; a bad cache is one SrtError line."""
    if path is None:
        return None
    from srtcli.tree_cache import TreeCache

    return TreeCache.open(path, writer)
