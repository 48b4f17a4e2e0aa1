"""What a run saves to continue: :class:`TrainState` and the ``last.pt`` extras (optimisers,
loss state, RNG) that :class:`~nearsight.training.trainer.Trainer` writes and resumes from,
so an interrupted run continues with exactly the batch and learning rate it would have had.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from nearsight.training.config import TrainConfig
from nearsight.training.run_files import RunFiles


class Trainer(Protocol):
    """What a resume reads and writes of a run (nearsight/training/trainer.py's Trainer, which
    imports this module)."""

    @property
    def config(self) -> TrainConfig: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def files(self) -> RunFiles: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def loss_fn(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def critic_optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def selection_metric(self) -> str: ...


@dataclass
class TrainState:
    """Where a run is; saved in ``last.pt`` and restored on resume."""

    step: int = 0  # embedding updates
    batch: int = 0  # batches drawn (critic batches included)
    epoch: int = 0
    batch_in_epoch: int = 0
    train_seconds: float = 0.0  # time in training batches, evaluations and saves excluded
    best: float = -1.0  # the selection metric of best.pt
    best_step: int = -1
    best_metrics: dict[str, Any] = field(default_factory=dict)  # test metrics of best.pt
    last_metrics: dict[str, Any] = field(default_factory=dict)  # of the last evaluation


def model_extra(
    config: TrainConfig, state: TrainState, metrics: dict | None, selected_by: str
) -> dict[str, Any]:
    """The ``training`` record every checkpoint of the run carries."""
    return {
        "training": {
            "loss": config.loss.name,
            "dataset": config.data.dataset,
            "step": state.step,
            "metrics": metrics or {},
            "selected_by": selected_by,
            "config": config.to_dict(),
        }
    }


def save_last(trainer: Trainer, state: TrainState) -> None:
    """Write ``last.pt``: the model and everything a resume needs."""
    extra = model_extra(trainer.config, state, None, trainer.selection_metric)
    extra.update(
        {
            "state": asdict(state),
            "optimizer": trainer.optimizer.state_dict(),
            "loss_state": trainer.loss_fn.state_dict(),
            "critic_optimizer": (
                trainer.critic_optimizer.state_dict() if trainer.critic_optimizer else None
            ),
            "rng": {"torch": torch.get_rng_state()},
        }
    )
    trainer.files.save_last(trainer.model, extra)


def load_last(trainer: Trainer) -> TrainState:
    """Restore the trainer from ``last.pt`` and give back where the run was."""
    checkpoint = trainer.files.load_last(trainer.device)
    trainer.model.load_state_dict(checkpoint["state_dict"])
    trainer.optimizer.load_state_dict(checkpoint["optimizer"])
    trainer.loss_fn.load_state_dict(checkpoint["loss_state"])
    if trainer.critic_optimizer is not None and checkpoint.get("critic_optimizer"):
        trainer.critic_optimizer.load_state_dict(checkpoint["critic_optimizer"])
    torch.set_rng_state(checkpoint["rng"]["torch"].cpu())
    state = TrainState(**checkpoint["state"])
    trainer.files.truncate_logs(state.batch)
    print(f"resumed from {trainer.files.last} at step {state.step}", file=sys.stderr)
    return state
