"""What goes into a training step and what comes out of it, without stopping the device.

:class:`DeviceBatches` puts the next batch on the device while the current step runs: on CUDA
its (pinned) uint8 images and labels are copied on a side stream and turned into the model's
float input there, so the step never waits for a host-to-device copy. On a CPU the batches
pass through unchanged (the step converts them, as it always did).

:class:`DeferredValues` reads a step's numbers (its loss) back on the host a step later: the
value is copied into pinned host memory without blocking and read once the next step is queued,
so the device always has a step to run while the host writes the logs. On a CPU there is
nothing to overlap and values are read at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from nearsight.training.data import to_unit_range

Batch = tuple[torch.Tensor, torch.Tensor]


class DeviceBatches:
    """The batches of ``loader`` on ``device``, each one's copy started a step ahead (CUDA)."""

    def __init__(self, loader: Iterable[Batch], device: torch.device, channels_last: bool):
        self.loader = loader
        self.device = device
        self.channels_last = channels_last
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __iter__(self) -> Iterator[Batch]:
        if self.stream is None:
            yield from self.loader
            return
        batches = iter(self.loader)
        pending = self._send(next(batches, None))
        while pending is not None:
            following = self._send(next(batches, None))  # overlaps the step on `pending`
            yield self._receive(pending)
            pending = following

    def _send(self, batch: Batch | None) -> Batch | None:
        if batch is None:
            return None
        assert self.stream is not None
        images, labels = batch
        with torch.cuda.stream(self.stream):
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            if images.dtype == torch.uint8:
                images = to_unit_range(images, self.channels_last)
        return images, labels

    def _receive(self, batch: Batch) -> Batch:
        assert self.stream is not None
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for tensor in batch:
            # made on the side stream, used on the step's: the allocator must not reuse its
            # memory before the step is done with it
            tensor.record_stream(current)
        return batch


def step_input(images: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """The model's input from a batch that :class:`DeviceBatches` did not convert (a CPU)."""
    if images.dtype != torch.uint8:
        return images
    return to_unit_range(images.to(device, non_blocking=True), channels_last)


class DeferredValues:
    """Scalar tensors of the steps, read back on the host ``lag`` steps later (CUDA)."""

    def __init__(self, device: torch.device, lag: int | None = None):
        self.cuda = device.type == "cuda"
        self.lag = (1 if self.cuda else 0) if lag is None else lag
        self._pending: deque[tuple[torch.Tensor, torch.cuda.Event | None, Any]] = deque()

    def push(self, value: torch.Tensor, payload: Any) -> None:
        """Start reading ``value`` (a scalar on the device); ``payload`` comes back with it."""
        value = value.detach().float()
        if not self.cuda:
            self._pending.append((value, None, payload))
            return
        host = torch.empty((), dtype=torch.float32, pin_memory=True)
        host.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((host, event, payload))

    def ready(self, *, wait_all: bool = False) -> list[tuple[float, Any]]:
        """The values older than ``lag`` steps (every value with ``wait_all``), oldest first,
        waiting for the device where one is not copied yet."""
        keep = 0 if wait_all else self.lag
        done = []
        while len(self._pending) > keep:
            host, event, payload = self._pending.popleft()
            if event is not None:
                event.synchronize()
            done.append((float(host), payload))
        return done

    def __len__(self) -> int:
        return len(self._pending)
