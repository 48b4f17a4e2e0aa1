"""The one barrier of a torchrun's processes, for training and the sharded gallery build
alike (torch is imported only when there is more than one process)."""

from __future__ import annotations


def wait_for_all(world: int) -> None:
    """Wait until every one of the ``world`` processes of the process group gets here; for a
    single process, nothing."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
