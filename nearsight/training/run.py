"""``train(config, out_dir)``: one training run, the function the CLI, the demo and the bench call.

from nearsight.training.config import load_config
from nearsight.training.run import train

result = train(load_config("nearsight/training/configs/ice_cub.yaml", {"data.root": "CUB_200_2011"}),
               "runs/ice_cub")
result.best["recall@1"]   # test Recall@1 of best.pt
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.training.config import TrainConfig, load_config


@dataclass
class TrainResult:
    """What a run did; ``best.pt`` and ``last.pt`` in ``out_dir`` hold the two networks."""

    out_dir: Path
    steps: int  # updates of the embedding network
    batches: int  # batches drawn (RankMI's critic batches included)
    seconds: float  # wall time of this call
    train_seconds: float  # time in training batches over the whole run (resumes included)
    selected_by: str  # what best.pt was chosen by: "val/recall@1" or "test/recall@1"
    best_step: int
    best_score: float  # the selection metric at best_step
    best: dict[str, Any] = field(default_factory=dict)  # test metrics of best.pt
    last: dict[str, Any] = field(default_factory=dict)  # test metrics at the last evaluation
    # the arithmetic this call trained in: "bf16" (autocast) or "fp32", and the line saying
    # where and why (nearsight.models.hardware.resolve_fast_math)
    precision: str = ""
    precision_detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["out_dir"] = str(self.out_dir)
        return values

    def summary(self) -> str:
        """The end-of-run lines: test Recall@k of the best checkpoint and of the last one."""

        def recalls(metrics: dict[str, Any]) -> str:
            keys = [k for k in metrics if k.startswith("recall@")] + ["nmi", "map@r"]
            return " ".join(f"{k} {metrics[k]:.4f}" for k in keys if k in metrics) or "-"

        chosen = "validation" if self.selected_by.startswith("val/") else "test"
        return (
            f"trained {self.steps} steps in {self.train_seconds:.0f}s of training "
            f"({self.seconds:.0f}s wall); run in {self.out_dir}\n"
            f"best.pt (step {self.best_step}, best {chosen} {self.selected_by.split('/')[-1]}"
            f" {self.best_score:.4f}): test {recalls(self.best)}\n"
            f"last.pt (step {self.steps}): test {recalls(self.last)}"
        )


def train(config: TrainConfig, out_dir: str | Path, *, resume: bool = False) -> TrainResult:
    """Train one run into ``out_dir`` (a new folder, or with ``resume`` the folder of a run to
    continue from its ``last.pt``); see :mod:`nearsight.training.trainer`."""
    from nearsight.training.trainer import Trainer

    started = time.perf_counter()
    trainer = Trainer(config, out_dir, resume=resume)
    state = trainer.run()
    return TrainResult(
        out_dir=Path(out_dir),
        steps=state.step,
        batches=state.batch,
        seconds=time.perf_counter() - started,
        train_seconds=state.train_seconds,
        selected_by=trainer.selection_metric,
        best_step=state.best_step,
        best_score=state.best,
        best=dict(state.best_metrics),
        last=dict(state.last_metrics),
        precision="bf16" if trainer.amp else "fp32",
        precision_detail=trainer.precision,
    )


def resume_config(out_dir: str | Path) -> TrainConfig:
    """The resolved configuration a run saved, for ``--resume``."""
    path = Path(out_dir) / "config.yaml"
    if not path.exists():
        raise NearsightError(f"cannot resume: {path} does not exist")
    return load_config(path)
