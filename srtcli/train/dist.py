"""torch.distributed helpers for `srt train`: one process or many, same code path.

`torchrun` (or `srt train --nproc N`, which launches it) sets RANK / WORLD_SIZE / LOCAL_RANK;
`init()` joins the group (gloo on CPU, NCCL on CUDA) and returns a `DistInfo`. With a single
process every helper here is the identity, so the training loop never branches on it.

Why sums and not averages: the loss is normalised by *global* counts (trained tokens or
sequences of the whole optimizer-step batch, see srtcli.train.loss), so each rank's gradient is
already its exact share of the global gradient; summing the shares gives the single-process
gradient. Averaging would only be right if every rank had the same normaliser.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist

# flatten gradients into buckets of about this many bytes for all-reduce
BUCKET_BYTES = 32 << 20


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank, world size, and its device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: str | None = None) -> DistInfo:
    """Join the process group when launched by torchrun; otherwise a single process."""
    cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) <= 1:
        return DistInfo(device="cuda" if cuda else "cpu")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if not tdist.is_initialized():
        tdist.init_process_group(backend="nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(local)
    return DistInfo(rank, world, local, f"cuda:{local}" if cuda else "cpu")


def shutdown(info: DistInfo) -> None:
    if info.active and tdist.is_initialized():
        tdist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.active:
        tdist.barrier()


def all_reduce_sum(info: DistInfo, values: list[float]) -> list[float]:
    """Sum a few numbers over all ranks (float64, so counts stay exact)."""
    if not info.active:
        return list(values)
    dev = info.device if info.device.startswith("cuda") else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(info: DistInfo, value: float) -> float:
    if not info.active:
        return value
    dev = info.device if info.device.startswith("cuda") else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=dev)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return float(t.item())


def sum_gradients(info: DistInfo, params: list[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in flat buckets.

    A rank that saw no data has no `.grad`; it contributes zeros so that all ranks issue the
    same collectives in the same order.
    """
    if not info.active:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params:
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= BUCKET_BYTES:
            _reduce_bucket(bucket)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket)


def _reduce_bucket(grads: list[torch.Tensor]) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in group])
        tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
        offset = 0
        for g in group:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

