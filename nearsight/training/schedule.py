"""Learning-rate schedules over however the run's length is given: steps, epochs or time.

The multiplier of the base rates is ``warmup(step) x decay(progress)``:

- ``warmup``: linear from 1/warmup_steps to 1 over the first ``warmup_steps`` steps (Goyal et
  al. 2017, "Accurate, Large Minibatch SGD"), then 1.
- ``progress`` in [0, 1]: the share of the run done. A run with a step budget (``steps``, or
  ``epochs`` turned into steps) counts steps after the warmup; a run with a time limit counts
  its elapsed training time (evaluations excluded); a run with both takes whichever is further,
  so a run cut by its time limit still ends at the low rate instead of mid-peak.
- ``decay``: ``constant`` 1; ``cosine`` 0.5 (1 + cos(pi progress)) (Loshchilov and Hutter,
  SGDR, ICLR 2017, without restarts), or with ``decay_start`` s the rate holds until progress
  s and the cosine runs over the rest, 0.5 (1 + cos(pi (progress - s) / (1 - s))) (the
  trapezoidal or warmup-stable-decay shape: a short run keeps its full rate longer and still
  ends at the low one); ``step`` gamma ** (milestones passed), milestones in
  steps (>= 1) or as shares of the run (< 1, so they also work for a time-limited run).

A step is one update of the embedding network (RankMI's critic batches do not count), so the
schedule is a pure function of (steps done, training seconds used): a resumed run that restores
both from ``last.pt`` gets exactly the rates of an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nearsight.training.config import TrainConfig

SCHEDULES = ("constant", "step", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the base learning rates as a function of steps done and seconds used."""

    name: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None  # the step budget; None for a run bounded by time only
    time_limit_s: float | None = None
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1
    decay_start: float = 0.0  # cosine: the share of the run before which the rate holds

    @classmethod
    def from_config(cls, config: TrainConfig, total_steps: int | None) -> LRSchedule:
        optim = config.optim
        return cls(
            name=optim.schedule,
            warmup_steps=optim.warmup_steps or 0,
            total_steps=total_steps,
            time_limit_s=config.time_limit_s,
            milestones=tuple(optim.milestones),
            gamma=optim.gamma,
            decay_start=optim.decay_start,
        )

    def progress(self, step: int, elapsed_s: float = 0.0) -> float:
        """The share of the run done after ``step`` steps and ``elapsed_s`` training seconds."""
        shares = [0.0]
        if self.total_steps is not None:
            span = max(1, self.total_steps - self.warmup_steps)
            shares.append((step - self.warmup_steps) / span)
        if self.time_limit_s:
            shares.append(elapsed_s / self.time_limit_s)
        return min(1.0, max(shares))

    def factor(self, step: int, elapsed_s: float = 0.0) -> float:
        """The multiplier for the update that follows ``step`` steps and ``elapsed_s`` seconds."""
        warmup = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        progress = self.progress(step, elapsed_s)
        if self.name == "cosine":
            tail = max(0.0, progress - self.decay_start) / (1.0 - self.decay_start)
            decay = 0.5 * (1.0 + math.cos(math.pi * tail))
        elif self.name == "step":
            passed = sum(progress >= m if m < 1 else step >= m for m in self.milestones)
            decay = self.gamma**passed
        else:
            decay = 1.0
        return warmup * decay


def set_learning_rates(optimizer, factor: float) -> None:
    """Every parameter group at its rate before any schedule (``base_lr``) times ``factor``."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
