"""The per-batch logs of a run (train.jsonl, the progress line, TensorBoard), written from
values read back a step late (:class:`~nearsight.training.step_io.DeferredValues`), so that
logging never makes the host wait for the device inside a step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nearsight.training.loss_roles import logged_scalars
from nearsight.training.progress import TrainProgress
from nearsight.training.run_files import RunFiles
from nearsight.training.step_io import DeferredValues


@dataclass
class BatchRecord:
    """What the host knows of a batch when its step is queued (all but the loss)."""

    step: int
    batch: int
    train_seconds: float
    images_per_s: float
    critic: bool
    learning_rates: dict[str, float]
    loss_scalars: dict[str, float] | None  # the loss's own numbers, on logging steps


class StepLogs:
    """Queues each batch's record with its loss tensor; writes them as the losses arrive."""

    def __init__(
        self,
        files: RunFiles,
        progress: TrainProgress,
        optimizer: torch.optim.Optimizer,
        loss: nn.Module,
        *,
        batch_size: int,
        log_every: int,
        device: torch.device,
    ):
        self.files, self.progress = files, progress
        self.optimizer, self.loss = optimizer, loss
        self.batch_size, self.log_every = batch_size, log_every
        self.values = DeferredValues(device)
        self._arrived: list[tuple[float, BatchRecord]] = []

    def settle(self) -> None:
        """Wait until the device has finished every step but the newest ``lag`` (the batch's
        time, measured after this, covers the device's work and not only the host's)."""
        self._arrived.extend(self.values.ready())

    def push(
        self, loss: torch.Tensor, *, step: int, batch: int, train_seconds: float, seconds: float,
        critic: bool,
    ) -> None:  # fmt: skip
        """The batch that made ``step`` steps (``batch`` batches) ran ``seconds`` on the host."""
        logging_step = not critic and step % self.log_every == 0
        record = BatchRecord(
            step=step,
            batch=batch,
            train_seconds=train_seconds,
            images_per_s=self.batch_size / max(seconds, 1e-9),
            critic=critic,
            learning_rates={g["name"]: g["lr"] for g in self.optimizer.param_groups},
            loss_scalars=logged_scalars(self.loss) if logging_step else None,
        )
        self.values.push(loss, record)
        self.flush()

    def flush(self, *, wait_all: bool = False) -> None:
        """Write the records whose loss has arrived (every queued one with ``wait_all``:
        before an evaluation, a checkpoint or the end), oldest first."""
        self.settle()
        if wait_all:
            self._arrived.extend(self.values.ready(wait_all=True))
        arrived, self._arrived = self._arrived, []
        for loss, record in arrived:
            self._write(loss, record)

    def _write(self, loss: float, record: BatchRecord) -> None:
        line: dict[str, Any] = {
            "step": record.step,
            "batch": record.batch,
            "loss": loss,
            "images_per_s": round(record.images_per_s, 2),
        }
        if record.critic:
            line["phase"] = "critic"
        line.update({f"lr_{name}": lr for name, lr in record.learning_rates.items()})
        self.files.append_train(line)
        if record.critic:
            return
        self.progress.update(record.step, record.train_seconds, loss, record.images_per_s)
        if record.loss_scalars is None:
            return
        scalars = {"train/loss": loss, "train/images_per_s": record.images_per_s}
        scalars.update({f"lr/{name}": lr for name, lr in record.learning_rates.items()})
        scalars.update({f"train/{k}": v for k, v in record.loss_scalars.items()})
        self.files.scalars(scalars, record.step)
