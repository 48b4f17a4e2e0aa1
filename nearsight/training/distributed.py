"""Distributed data parallel helpers: process group, device, gathering the global batch.

Under ``torchrun`` (WORLD_SIZE > 1) each process embeds a contiguous slice of the same global
batch; the slices are all-gathered (each process keeping the gradient path of its own slice) so
the loss sees the whole batch design, exactly as a single process would. A single process
needs none of this: every helper is then a no-op.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch
import torch.distributed as dist

from nearsight.core.distributed import wait_for_all
from nearsight.core.errors import NearsightError


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str) -> DistInfo:
    """Join the process group when launched by torchrun; a no-op for a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def cuda_available() -> bool:
    """torch.cuda.is_available() without its multi-line warning on a broken driver install."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.cuda.is_available()
        except RuntimeError:
            return False


CPU_FALLBACK_NOTE = "nearsight: note: no CUDA device, training on the CPU"


def resolve_device(name: str, local_rank: int = 0, *, note: bool = True) -> torch.device:
    """``auto``: CUDA when there is a device, else the CPU with a one-line note on stderr
    (``note=False`` leaves the note to the caller); ``cuda`` without a device is a one-line
    error."""
    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
        if name == "cpu" and local_rank == 0 and note:
            print(CPU_FALLBACK_NOTE, file=sys.stderr)
    if name == "cuda":
        if not cuda_available():
            raise NearsightError("--device cuda was asked for, but no CUDA device is available")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def gather_with_grad(local: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """All-gather equal-sized slices; this process's own slice keeps its autograd path."""
    if info.world == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(info.world)]
    dist.all_gather(parts, local.detach().contiguous())
    parts[info.rank] = local
    return torch.cat(parts)


def agree(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """Process 0's answer, for every process (e.g. whether the time limit has passed)."""
    if info.world == 1:
        return flag
    value = torch.tensor([int(flag)], device=device if device.type == "cuda" else "cpu")
    dist.broadcast(value, src=0)
    return bool(value.item())


def barrier(info: DistInfo) -> None:
    wait_for_all(info.world)


Sample = TypeVar("Sample")  # what a batch lists (an index, with its seed)


class Batches(Protocol[Sample]):
    """An epoch's global batches, and how many there are."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[list[Sample]]: ...


class RankSlice(Generic[Sample]):
    """This process's contiguous slice of each global batch (the whole batch for one process)."""

    def __init__(self, batches: Batches[Sample], rank: int, local: int):
        self.batches, self.rank, self.local = batches, rank, local

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[Sample]]:
        for batch in self.batches:
            yield batch[self.rank * self.local : (self.rank + 1) * self.local]


def average_replicated_grads(
    parameters: Iterable[torch.nn.Parameter], info: DistInfo, scale: float = 1.0
) -> None:
    """Gradients of parameters each process holds a copy of outside DDP (a loss's proxies or
    critic). Every process computed its loss on the whole gathered batch, so each gradient is
    already the full-batch one times ``scale`` (the world-size factor the embedding loss is
    multiplied by); divide it out and average over the processes (the same numbers up to
    rounding), so the copies step identically."""
    if info.world == 1:
        return
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad.div_(info.world * scale)
