"""A run folder's files: config.yaml, metrics.jsonl, train.jsonl, TensorBoard, last.pt, best.pt.

Only process 0 of a distributed run writes. Every file is written so that a kill at any moment
leaves the previous version or the new one: checkpoints and config.yaml through a temporary
file renamed into place, the JSON logs by whole appended lines (a line cut short by a kill, and
lines past the resumed step, are dropped on resume).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nearsight.core.atomic import atomic_file
from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import load_checkpoint, save_checkpoint

# models.atomic's temporary names (tempfile: 8 random characters) for the files of a run
_RUN_TEMPORARY = re.compile(
    r"\.(last\.pt|best\.pt|config\.yaml|metrics\.jsonl|train\.jsonl)\.[a-z0-9_]{8}\.tmp"
)
LOGS = ("metrics.jsonl", "train.jsonl")


def _line_batch(line: str) -> float:
    """The batch count of a JSON log line; a line cut short by a kill counts as past any."""
    try:
        record = json.loads(line)
        return record.get("batch", record["step"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return math.inf


class RunFiles:
    """The files of the run folder ``out_dir``; ``main`` is False on processes that write none."""

    def __init__(self, out_dir: str | Path, *, main: bool = True):
        self.out_dir = Path(out_dir)
        self.main = main
        self._tb: Any = None

    @property
    def last(self) -> Path:
        return self.out_dir / "last.pt"

    @property
    def best(self) -> Path:
        return self.out_dir / "best.pt"

    def check(self, resume: bool) -> None:
        """Refuse a run folder that cannot take this run (checks only: nothing is written)."""
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise NearsightError(f"--out {self.out_dir} is a file, not a run folder")
        if resume:
            if not self.last.exists():
                raise NearsightError(f"cannot resume: {self.last} does not exist")
            return
        if self.last.exists():
            raise NearsightError(
                f"{self.out_dir} already holds a run (last.pt): use --resume to continue it, "
                "or choose another --out"
            )

    def start(self, config_yaml: str, resume: bool) -> None:
        """A new run: create the folder, write config.yaml, clear old logs. Either way, sweep
        the temporaries of a killed run. Called once data, model, sampler and loss are known to
        be good, so a run refused for bad input leaves no folder behind."""
        if not self.main:
            return
        if not resume:
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as error:  # a file where a parent folder should be, no permission
                raise NearsightError(f"cannot create {self.out_dir}: {error.strerror}") from None
            with atomic_file(self.out_dir / "config.yaml", "w") as handle:
                handle.write(config_yaml)
            for name in LOGS:
                (self.out_dir / name).unlink(missing_ok=True)
        # a run killed mid-write (SIGKILL, power loss) leaves its temporary file behind: up to
        # a whole checkpoint, hidden, never read; the run that takes over the folder removes it
        for path in self.out_dir.iterdir():
            if _RUN_TEMPORARY.fullmatch(path.name) and path.is_file():
                path.unlink(missing_ok=True)

    # -- logs ---------------------------------------------------------------------------
    def _append(self, name: str, record: dict[str, Any]) -> None:
        if self.main:
            with open(self.out_dir / name, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def append_metrics(self, record: dict[str, Any]) -> None:
        self._append("metrics.jsonl", record)

    def append_train(self, record: dict[str, Any]) -> None:
        """``train.jsonl``: the loss curve, one line per batch (TensorBoard holds the same)."""
        self._append("train.jsonl", record)

    def truncate_logs(self, batch: int) -> None:
        """A run killed after writing log lines but before its next last.pt repeats those
        batches on resume: drop lines past the resumed batch so none appears twice."""
        if not self.main:
            return
        for name in LOGS:
            path = self.out_dir / name
            if not path.exists():
                continue
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            kept = [line for line in lines if _line_batch(line) <= batch]
            if len(kept) != len(lines):
                with atomic_file(path, "w") as handle:
                    handle.write("".join(line + "\n" for line in kept))

    def scalars(self, values: dict[str, float], step: int) -> None:
        """TensorBoard scalars (skipped when tensorboard cannot be imported)."""
        if not self.main:
            return
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # a dependency, but logging must never kill a run
                return
            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))
        for key, value in values.items():
            self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    # -- checkpoints --------------------------------------------------------------------
    def save_best(self, model: nn.Module, extra: dict[str, Any]) -> None:
        if self.main:
            save_checkpoint(self.best, model, extra=extra)

    def save_last(self, model: nn.Module, extra: dict[str, Any]) -> None:
        if self.main:
            save_checkpoint(self.last, model, extra=extra)

    def load_last(self, device: torch.device) -> dict[str, Any]:
        return load_checkpoint(self.last, map_location=device)
