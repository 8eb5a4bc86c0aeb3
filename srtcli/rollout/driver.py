"""One rollout, whichever engine generates it: the engine is a `Backend`, everything else is here.

The driver plans the run (srtcli.rollout.plan: cache keys, reward, what a resumed pool still
needs), opens the tree cache and the pool, lets the backend generate one rollout batch after
another, writes each finished group (a reward per sample, one pool step per model turn, then a
flush: a killed run leaves whole groups), advances the cache clock after each batch, shows
progress, and builds the summary. Backends: `srtcli.rollout.embedded.EmbeddedBackend` (srt's
own engine) and `srtcli.rollout.vllm.engine.VllmBackend` (vLLM's offline API).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from srtcli.cache import open_cache
from srtcli.progress import Bar, progress
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.plan import Plan, plan
from srtcli.rollout.steps import Sample, turn_steps
from srtcli.rollout.summary import Counts, Run, summary


class Groups:
    """Where a backend hands finished groups and the end of each rollout batch."""

    def __init__(self, writer: Any, pl: Plan, k: int, bar: Bar, store: Any, temperature: float):
        self.writer, self.plan, self.k, self.bar, self.store = writer, pl, k, bar, store
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
        """A rollout batch ended (its sequences are in the store): advance the cache clock."""
        if self.store is not None:
            self.store.tick()


class Backend(Protocol):
    """An engine behind the driver, called in this order (`close` and `shutdown` always)."""

    def load(self, config: RolloutConfig) -> tuple[Any, list]:
        """The tokenizer and the prompts; what the user can fix fails here, before any write."""

    def check(self, pl: Plan) -> None:
        """What must fail before the cache is opened (the plan is known now)."""

    def start(self, pl: Plan, store: Any) -> None:
        """Ready to generate, drafting from `store` (None when the run uses no cache)."""

    def generate(self, pl: Plan, groups: Groups) -> None:
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
    store = open_cache(config.cache_opt) if config.uses_cache else None
    try:
        backend.start(pl, store)
        t0, c0 = time.perf_counter(), time.process_time()
        rewards = _write(config, backend, pl, store)
    finally:
        backend.close()
        if store is not None:
            store.close()
    run = Run(time.perf_counter() - t0, time.process_time() - c0, rewards, len(pl.prompts), len(pl.skip))
    counts, middle, tail = backend.report(run)
    return summary(config, run, counts, pl.out, middle, tail)


def _write(config: RolloutConfig, backend: Backend, pl: Plan, store: Any) -> list[float]:
    """Generate into the pool; the rewards of the trajectories written."""
    from srtcli.pool import PoolWriter

    writer = PoolWriter(pl.out, resume=config.resume, fsync_every=1 << 30)
    try:
        with progress("rollout (prompts)", total=len(pl.todo)) as bar:
            groups = Groups(writer, pl, config.k, bar, store, config.temperature)
            backend.generate(pl, groups)
    finally:
        writer.close()
    return groups.rewards
