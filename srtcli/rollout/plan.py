"""What a rollout run has to do, the same for every engine, and what a pool already holds.

Every trajectory's last step carries `meta.last = true` and `meta.group_size = K`; a group is
whole when its K trajectories all have their last step. `--resume` keeps the whole groups of
the pool file, cuts any trailing partial group (or partial line), and rolls out the rest
(`completed_groups`); after Ctrl-C, `whole_groups` counts what the pool keeps, reading only.
Both read the pool's lines with `pool_lines`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from srtcli.errors import at
from srtcli.rollout.config import RolloutConfig


@dataclass
class Plan:
    """The prompts of a run and what is left to do with them."""

    prompts: list  # PromptRecord, in file order
    uids: list[str]  # each prompt's cache key, also the pool's prompt_uid
    reward_fn: Callable[[dict, str], float]
    out: Path  # the pool file
    skip: set[str]  # groups a resumed pool already holds whole
    todo: list[int]  # indices of the prompts still to roll out
    per: int  # prompts per rollout batch

    @property
    def chunks(self) -> list[list[int]]:
        """The prompts still to do, one list per rollout batch."""
        return [self.todo[i: i + self.per] for i in range(0, len(self.todo), self.per)]

T = TypeVar("T")


def admission_order(chunk: list[int], k: int, order: str = "sample") -> list[tuple[int, int]]:
    """The (prompt, sample) pairs of a rollout batch in the order the engine starts them.
    "sample" (sample-major: sample 0 of every prompt, then sample 1, ...): when the batch holds
    more samples than the engine has rows, a prompt's later samples start once rows free up, and
    draft from the outputs its earlier samples have completed or run ahead with, instead of all
    K starting together and feeding each other only what they generate in lockstep; the
    samples that do start together still share their prompt's prefill. "prompt"
    (prompt-major): a prompt's K samples together, so its prompt is prefilled once."""
    groups = [[(i, s) for s in range(k)] for i in chunk]
    return [pair for g in groups for pair in g] if order == "prompt" else sample_major(groups)


def sample_major(groups: list[list[T]]) -> list[T]:
    """The first member of every group, then every second, ... (groups may differ in size)."""
    return [g[s] for s in range(max(map(len, groups), default=0)) for g in groups if s < len(g)]


def check_prompts_early(config: RolloutConfig) -> None:
    """Prompt-file errors that need no model (JSON, the reward's fields), before it loads."""
    from srtcli.rollout.prompts import read_records
    from srtcli.rollout.rewards import reward_for_prompts

    reward_for_prompts(config.reward_spec, read_records(config.prompts_path), config.prompts_path)


def plan(config: RolloutConfig, tok: Any, prompts: list) -> Plan:
    """Cache keys, the reward function, the pool file and, with --resume, what is left to do."""
    from cache_store.uid import prompt_uid
    from srtcli.rollout.rewards import reward_for_prompts
    from srtcli.tokenizers import tokenizer_fingerprint

    fp = tokenizer_fingerprint(tok)
    uids = [prompt_uid(p.ids, fp) for p in prompts]
    reward_fn = reward_for_prompts(config.reward_spec, [(p.line, p.record) for p in prompts], config.prompts_path)
    out = config.pool_file
    skip = completed_groups(out, config.k) if config.resume else set()
    todo = [i for i, u in enumerate(uids) if u not in skip]
    return Plan(prompts, uids, reward_fn, out, skip, todo, config.batch_prompts(len(todo)))


@dataclass
class PoolLine:
    """One non-blank line of a pool file: its step, or why it is not one."""

    lineno: int
    end: int  # byte offset just past the line
    step: Any  # StepRecord, or None
    error: str | None = None


def pool_lines(path: Path) -> Iterator[PoolLine]:
    """The non-blank lines of a pool file, each parsed as a step (a bad one carries its error)."""
    from srtcli.pool import parse_step

    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            offset += len(raw)
            if not raw.strip():
                continue
            try:
                yield PoolLine(lineno, offset, parse_step(raw.decode("utf-8")))
            except (ValueError, UnicodeDecodeError) as e:
                yield PoolLine(lineno, offset, None, str(e))


def _add_last(done: dict[str, set[str]], step: Any) -> None:
    """Count a trajectory's last step towards its group."""
    if step.meta.get("last"):
        done.setdefault(step.prompt_uid, set()).add(step.trajectory_id)


def completed_groups(path: Path, k: int) -> set[str]:
    """Groups already complete in a pool file left by an earlier run; cuts trailing partial
    groups (and a partial last line) so that only whole groups remain."""
    from srtcli.pool import truncate_partial_line

    if not path.exists():
        return set()
    truncate_partial_line(path)
    done: dict[str, set[str]] = {}
    seen: set[tuple[str, str, int]] = set()
    keep, last_uid = 0, None
    for line in pool_lines(path):
        step = _resumable(path, line, k, seen)
        if step.prompt_uid != last_uid and last_uid is not None and len(done.get(last_uid, ())) < k:
            raise at(path, line.lineno, "cannot resume: an incomplete group is followed by another")
        last_uid = step.prompt_uid
        _add_last(done, step)
        if len(done.get(step.prompt_uid, ())) == k:
            keep = line.end
    if keep != path.stat().st_size:
        with open(path, "rb+") as f:
            f.truncate(keep)
    return {uid for uid, t in done.items() if len(t) == k}


def _resumable(path: Path, line: PoolLine, k: int, seen: set[tuple[str, str, int]]) -> Any:
    """The line's step, if a run with -n `k` can continue after it; else the reason, located."""
    if line.step is None:
        raise at(path, line.lineno, f"cannot resume: {line.error}")
    step = line.step
    size = step.meta.get("group_size")
    if size != k:
        raise at(path, line.lineno, f"cannot resume: written with -n {size}, now -n {k}")
    key = (step.prompt_uid, step.trajectory_id, step.step)
    if key in seen:
        raise at(path, line.lineno, f"cannot resume: trajectory {step.trajectory_id!r} step {step.step} "
                                    "appears twice")
    seen.add(key)
    return step


def whole_groups(pool: Path) -> int | None:
    """Groups whose every trajectory is in the pool file (None if the file is missing or
    empty); reads only, unlike `completed_groups`, which also cuts what --resume redoes."""
    done: dict[str, set[str]] = {}
    sizes: dict[str, Any] = {}
    lines = 0
    try:
        for line in pool_lines(pool):
            lines += 1
            if line.step is None:
                continue  # a partial last line, or a line some other tool left: --resume judges it
            _add_last(done, line.step)
            if line.step.meta.get("last"):
                sizes[line.step.prompt_uid] = line.step.meta.get("group_size")
    except OSError:
        return None
    if not lines:
        return None
    return sum(len(t) == sizes[uid] for uid, t in done.items())
