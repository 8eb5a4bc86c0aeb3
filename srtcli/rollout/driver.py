"""One rollout, whichever engine generates it: the engine is a `Backend`, everything else is here.

The driver plans the run (srtcli.rollout.plan: cache keys, reward, what a resumed pool still
needs), opens the run's tree session (`srtcli.rollout.tree_session.TreeSession`: the prompts'
trees and the cache they load from and are stored in) where the backend drafts in this process,
and the pool; then, inside the backend's `running` block, it takes what the backend yields: each finished group it
writes (a reward per sample, one pool step per model turn, then a flush: a killed run leaves
whole groups), each batch end it passes to the session (what the batch wrote is appended, then
the clock advances). It shows progress; the block's end releases what the backend took for the
run, and the session closes on its own (neither needs the other to close); then the summary. Backends: `srtcli.rollout.embedded.EmbeddedBackend`
(srt's own engine, drafting from the driver's session) and `srtcli.rollout.vllm.engine.VllmBackend`
(vLLM's offline API, whose proposer keeps its session in vLLM's worker).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator, Protocol

from srtcli.progress import Bar, progress
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.plan import Plan, plan
from srtcli.rollout.steps import Sample, turn_steps
from srtcli.rollout.summary import Counts, Run, summary
from srtcli.rollout.tree_session import TreeSession


@dataclass
class FinishedGroup:
    """Prompt `index`'s K samples, in sample order, as a backend yields them."""

    index: int
    samples: list[Sample]


@dataclass
class BatchEnd:
    """A rollout batch is over (every group of it yielded)."""


class GroupWriter:
    """Where the driver writes finished groups: rewarded, one pool step per model turn, flushed."""

    def __init__(self, writer: Any, pl: Plan, k: int, bar: Bar, temperature: float):
        self.writer, self.plan, self.k, self.bar = writer, pl, k, bar
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


class Backend(Protocol):
    """An engine behind the driver: `load`, `check`, then `running` for the generation, then
    `report`; `shutdown` always. `drafts_here`: its drafter runs in this process, from the
    driver's tree session."""

    drafts_here: bool

    def load(self, config: RolloutConfig) -> tuple[Any, list]:
        """The tokenizer and the prompts; what the user can fix fails here, before any write."""

    def check(self, pl: Plan) -> None:
        """What must fail before the cache is opened (the plan is known now)."""

    def running(self, pl: Plan, session: TreeSession | None) -> ContextManager[Iterator[FinishedGroup | BatchEnd]]:
        """Ready to generate (`session`: the driver's, where the backend drafts here), for the
        length of a with-block: every batch of `pl.chunks` in order, each group as it finishes,
        then the batch's end. What the run took is released when the block ends."""

    def report(self, run: Run) -> tuple[Counts, dict]:
        """The counts, and the engine's own summary keys."""

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
    session = None
    if backend.drafts_here and config.uses_cache:
        session = TreeSession.open(config.cache_opt, spill_dir=pl.out.parent, shared=config.shared_tree,
                                   load_tokens=config.load_tokens)
    try:
        with backend.running(pl, session) as events:
            t0, c0 = time.perf_counter(), time.process_time()
            rewards = _write(config, events, pl, session)
    finally:
        if session is not None:
            session.close()
    run = Run(time.perf_counter() - t0, time.process_time() - c0, rewards, len(pl.prompts), len(pl.skip))
    counts, engine_keys = backend.report(run)
    return summary(config, run, counts, pl.out, engine_keys)


def _write(config: RolloutConfig, events: Iterator[FinishedGroup | BatchEnd], pl: Plan,
           session: TreeSession | None) -> list[float]:
    """The backend's events into the pool; the rewards of the trajectories written."""
    from srtcli.pool import PoolWriter

    writer = PoolWriter(pl.out, resume=config.resume, fsync_every=1 << 30)
    try:
        with progress("rollout (prompts)", total=len(pl.todo)) as bar:
            groups = GroupWriter(writer, pl, config.k, bar, config.temperature)
            for event in events:
                if isinstance(event, FinishedGroup):
                    groups.group(event.index, event.samples)
                elif session is not None:
                    session.end_batch()
    finally:
        writer.close()
    return groups.rewards
