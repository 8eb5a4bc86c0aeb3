"""One rollout, whichever engine generates it: the engine is a `Backend`, everything else is here.

The driver plans the run (srtcli.rollout.plan: cache keys, reward, what a resumed pool still
needs), opens the tree cache (`srtcli.tree_cache.TreeCache`, which the backend's drafters load
from and hand sequences to) and the pool, lets the backend generate one rollout batch after
another, writes each finished group (a reward per sample, one pool step per model turn, then a
flush: a killed run leaves whole groups), ticks the cache after each batch (what the batch
wrote is appended, then the clock advances), shows progress, and builds the summary. Backends: `srtcli.rollout.embedded.EmbeddedBackend` (srt's
own engine) and `srtcli.rollout.vllm.engine.VllmBackend` (vLLM's offline API).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from srtcli.tree_cache import TreeCache
from srtcli.progress import Bar, progress
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.plan import Plan, plan
from srtcli.rollout.steps import Sample, turn_steps
from srtcli.rollout.summary import Counts, Run, summary


class GroupWriter:
    """Where a backend hands finished groups (written to the pool) and the end of each rollout batch."""

    def __init__(self, writer: Any, pl: Plan, k: int, bar: Bar, cache: TreeCache | None, temperature: float):
        self.writer, self.plan, self.k, self.bar, self.cache = writer, pl, k, bar, cache
        self.temperature = temperature
        self.rewards: list[float] = []  # one per trajectory written by this run

    def group(self, i: int, samples: list[Sample]) -> None:
        """Prompt `i`'s K samples, in sample order: rewarded, written and flushed."""
        prompt, uid = self.plan.prompts[i], self.plan.uids[i]
        for s in samples:
            self.rewards.append(self.plan.reward_fn(prompt.record, s.text) if s.reward is None else s.reward)
            for step in turn_steps(uid, prompt.id, s, self.rewards[-1], self.k, self.temperature):
                self.writer.write(step)
        self.writer.flush()
        self.bar.advance()

    def batch_done(self) -> None:
        """A rollout batch ended: its sequences reach the cache, then its clock advances."""
        if self.cache is not None:
            self.cache.tick()


class Backend(Protocol):
    """An engine behind the driver, called in this order (`close` and `shutdown` always)."""

    def load(self, config: RolloutConfig) -> tuple[Any, list]:
        """The tokenizer and the prompts; what the user can fix fails here, before any write."""

    def check(self, pl: Plan) -> None:
        """What must fail before the cache is opened (the plan is known now)."""

    def start(self, pl: Plan, cache: TreeCache | None) -> None:
        """Ready to generate, drafting from `cache` (None when the run uses no cache)."""

    def generate(self, pl: Plan, groups: GroupWriter) -> None:
        """Every batch of `pl.chunks` in order, each group to `groups.group`, then `batch_done`."""

    def close(self) -> None:
        """The pool is closed: release what `start` took."""

    def report(self, run: Run) -> tuple[Counts, dict, dict]:
        """The counts, and the engine's own summary keys (after the rates, and last)."""

    def shutdown(self) -> None:
        """The run is over (also after an error): stop what `load` started."""


def run_rollout(config: RolloutConfig, backend: Backend) -> dict[str, Any]:
    """The whole rollout through `backend`; returns the summary."""
    try:
        tok, prompts = backend.load(config)
        pl = plan(config, tok, prompts)
        backend.check(pl)
        return _generate(config, backend, pl)
    finally:
        backend.shutdown()


def _generate(config: RolloutConfig, backend: Backend, pl: Plan) -> dict[str, Any]:
    cache = TreeCache.open(config.cache_opt, spill_dir=pl.out.parent) if config.uses_cache else None
    try:
        backend.start(pl, cache)
        t0, c0 = time.perf_counter(), time.process_time()
        rewards = _write(config, backend, pl, cache)
    finally:
        backend.close()
        if cache is not None:
            cache.close()
    run = Run(time.perf_counter() - t0, time.process_time() - c0, rewards, len(pl.prompts), len(pl.skip))
    counts, middle, tail = backend.report(run)
    return summary(config, run, counts, pl.out, middle, tail)


def _write(config: RolloutConfig, backend: Backend, pl: Plan, cache: TreeCache | None) -> list[float]:
    """Generate into the pool; the rewards of the trajectories written."""
    from srtcli.pool import PoolWriter

    writer = PoolWriter(pl.out, resume=config.resume, fsync_every=1 << 30)
    try:
        with progress("rollout (prompts)", total=len(pl.todo)) as bar:
            groups = GroupWriter(writer, pl, config.k, bar, cache, config.temperature)
            backend.generate(pl, groups)
    finally:
        writer.close()
    return groups.rewards
