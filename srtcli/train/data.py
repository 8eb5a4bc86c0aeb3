"""What `srt train` feeds the model: work rows, optimizer-step batches, ranks, micro-batches.

A `WorkRow` is one forward unit: either a packed row from `srt pack` (many sequences, tree
attention) or, on the reference path (`--steps`), a single step run as a plain causal row.
Either way it carries the `TrainSeq`s it holds, each with its own advantage, so the loss
(srtcli.train.loss) sees the same per-sequence terms on both paths.

How the work is cut, outermost first:

1. `plan_batches`: an optimizer step consumes `--batch-size` *sequences* (steps), taken in
   data order; packed rows are atomic, so a batch of shards takes whole rows until it holds at
   least that many sequences. 0 means the whole data set in one optimizer step.
2. `split_ranks`: a batch's rows are dealt to ranks by token count (largest first, each to
   the least-loaded rank), deterministically, so every rank computes the same plan.
3. `micro_batches`: a rank's rows are grouped so that rows x longest row <= `--micro-batch-tokens`
   (a row longer than that runs alone); gradients accumulate across micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srtcli.advantages import grpo_advantages
from srtcli.errors import SrtError
from srtcli.pool import StepRecord, read_pool


@dataclass
class TrainSeq:
    """One training sequence (a step) with its advantage."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float

    @classmethod
    def from_step(cls, s: StepRecord, advantage: float) -> "TrainSeq":
        return cls(s.input_ids, s.loss_mask, s.old_logprobs, float(advantage))

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class WorkRow:
    """A forward unit: a packed row (`packed` set) or one plain causal sequence."""

    seqs: list[TrainSeq]
    packed: Any = None  # attention.PackedRow, aligned: seqs[i] <-> packed.paths[i]

    @property
    def tokens(self) -> int:
        """Unpacked tokens: what the sequences would cost one by one."""
        return sum(len(s) for s in self.seqs)

    @property
    def packed_tokens(self) -> int:
        return int(self.packed.n_real) if self.packed is not None else self.tokens

    @property
    def cost(self) -> int:
        """Tokens the forward actually runs (padding included)."""
        return len(self.packed) if self.packed is not None else self.tokens


@dataclass
class TrainData:
    rows: list[WorkRow]
    source: str  # "steps" or "shards"
    manifest: dict = field(default_factory=dict)
    temperatures: tuple[float, ...] = (1.0,)  # the distinct ones the steps were sampled at (`sampled_at`)

    @property
    def n_seqs(self) -> int:
        return sum(len(r.seqs) for r in self.rows)


def sampled_at(steps: list[StepRecord]) -> tuple[float, ...]:
    """The temperatures the steps were sampled at: their `meta.temperature` (`srt rollout`
    records it), 1 for steps that record none or were greedy (0)."""
    return tuple(sorted({float(s.meta.get("temperature") or 1.0) for s in steps})) or (1.0,)


def training_temperature(data: TrainData, override: float | None, where: Path) -> float:
    """The temperature training scores the policy at: `override` (`--temperature`), else the
    one the steps were sampled at. Their old log-probs are those of softmax(logits / T), so the
    policy's must be too (as TRL and verl score them); steps sampled at different temperatures
    share no one ratio and are refused."""
    if override is not None:
        return override
    if len(data.temperatures) > 1:
        shown = ", ".join(f"{t:g}" for t in data.temperatures)
        raise SrtError(f"{where}: steps sampled at different temperatures ({shown}): train each apart, "
                       f"or score them all at one with --temperature")
    return data.temperatures[0]


def load_steps(pool: Path, skip_bad: bool = False) -> TrainData:
    """The reference path: every step of the pool is its own plain row; GRPO where needed."""
    steps = read_pool(Path(pool), skip_bad=skip_bad)
    adv = grpo_advantages(steps)
    return TrainData([WorkRow([TrainSeq.from_step(s, a)]) for s, a in zip(steps, adv)], "steps",
                     temperatures=sampled_at(steps))


def load_packed(shards: Path) -> TrainData:
    """`srt pack` output: each shard row with its steps (advantages filled at pack time)."""
    shards = Path(shards)
    if not shards.exists():
        raise SrtError(f"{shards}: no such shards directory")
    if not shards.is_dir():
        raise SrtError(f"{shards}: not a directory (expected `srt pack` output)")
    from srtcli.shards import load_shards

    manifest, shard_rows = load_shards(shards)
    if not shard_rows:
        raise SrtError(f"{shards}: no packed rows (empty shards directory)")
    rows = []
    for i, sr in enumerate(shard_rows):
        if len(sr.steps) != len(sr.row.paths):
            raise SrtError(f"{shards}: row {i} has {len(sr.row.paths)} paths but {len(sr.steps)} steps")
        seqs = []
        for s in sr.steps:
            if s.advantage is None:
                raise SrtError(f"{shards}: row {i} has a step without an advantage (re-run `srt pack`)")
            seqs.append(TrainSeq.from_step(s, s.advantage))
        rows.append(WorkRow(seqs, sr.row))
    steps = [s for sr in shard_rows for s in sr.steps]
    return TrainData(rows, "shards", dict(manifest or {}), sampled_at(steps))


def check_fits(data: TrainData, model: Any, model_path: Path, where: Path) -> None:
    """A one-line error unless every token id is in the model's vocabulary and, for a model
    with a learned position table (GPT-2, OPT), every sequence within its positions; a forward
    would fail mid-run with an IndexError instead. Rotary and other relative positions have no
    hard limit and are not checked."""
    seqs = [s for r in data.rows for s in r.seqs]
    vocab = model.get_input_embeddings().num_embeddings
    top = max(max(s.input_ids) for s in seqs)
    if top >= vocab:
        raise SrtError(f"{where}: token id {top} is outside the vocabulary of {model_path} ({vocab} ids); "
                       "was the data made with another model?")
    limit = position_limit(model)
    longest = max(len(s) for s in seqs)
    if limit is not None and longest > limit:
        raise SrtError(f"{where}: a sequence of {longest} tokens is longer than {model_path} has positions "
                       f"for ({limit}, a learned position table)")


def position_limit(model: Any) -> int | None:
    """The longest sequence a model with learned absolute positions takes; None otherwise.

    Found from the model: an embedding table besides the token embeddings holds positions."""
    import torch

    tokens = model.get_input_embeddings()
    tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding) and m is not tokens]
    if not tables:
        return None
    limit = getattr(model.config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else min(m.num_embeddings for m in tables)


def plan_batches(rows: list[WorkRow], batch_size: int) -> list[list[WorkRow]]:
    """Cut the data (in order) into optimizer-step batches of >= batch_size sequences."""
    if batch_size <= 0:
        return [list(rows)]
    batches: list[list[WorkRow]] = [[]]
    count = 0
    for r in rows:
        if count >= batch_size:
            batches.append([])
            count = 0
        batches[-1].append(r)
        count += len(r.seqs)
    return batches


def split_ranks(rows: list[WorkRow], world: int) -> list[list[WorkRow]]:
    """Deal rows to `world` ranks balancing token cost; each rank keeps data order."""
    if world <= 1:
        return [list(rows)]
    order = sorted(range(len(rows)), key=lambda i: (-rows[i].cost, i))
    load = [0] * world
    owner = [0] * len(rows)
    for i in order:
        r = min(range(world), key=lambda k: (load[k], k))
        owner[i] = r
        load[r] += rows[i].cost
    return [[row for i, row in enumerate(rows) if owner[i] == r] for r in range(world)]


def micro_batches(rows: list[WorkRow], max_tokens: int) -> list[list[WorkRow]]:
    """Group rows so that len(group) * longest cost <= max_tokens (0: each row alone).

    Rows are sorted longest first so that a padded micro-batch wastes little.
    """
    if max_tokens <= 0:
        return [[r] for r in rows]
    order = sorted(rows, key=lambda r: -r.cost)
    out: list[list[WorkRow]] = []
    for r in order:
        if out and (len(out[-1]) + 1) * out[-1][0].cost <= max_tokens:
            out[-1].append(r)
        else:
            out.append([r])
    return out
