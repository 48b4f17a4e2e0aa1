"""What a training run shows while it runs: a tqdm bar (steps/s, ETA) on a terminal, plain
lines with the same numbers otherwise, and one note when the machine runs much slower than
the rate the recipe was sized for (``expected_steps_per_s``), saying what that costs and what
to do.

Rates are steps per second of training time (evaluations and checkpoints left out), so a
resumed run and a run with evaluations in the middle measure the same thing.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

from nearsight.core.progress import RateMeter, format_duration, much_slower

# a rate is judged only once it stands on this many steps and seconds of training
SLOW_CHECK_MIN_STEPS = 3
SLOW_CHECK_MIN_SECONDS = 20.0


def slow_machine_note(
    rate: float,
    expected: float,
    *,
    done: int,
    total_steps: int | None,
    time_limit_s: float | None,
) -> str:
    """The note for a run measured at ``rate`` steps/s where ``expected`` was planned: how
    long the steps left take at this rate (or, under a time limit, how few steps it makes), and
    the ``--steps`` that would fit the time the run was sized for."""
    head = (
        f"nearsight: note: training runs at {rate:.2f} steps/s, {expected / rate:.1f}x slower "
        f"than the {expected:.2f} steps/s this recipe expects (other work on this machine, or "
        "a slower one)"
    )
    if total_steps is not None:
        planned_s = total_steps / expected
        fits = max(1, int(rate * planned_s))
        return (
            f"{head}: the {total_steps} steps take about "
            f"{format_duration((total_steps - done) / rate)} more. It learns the same, only "
            f"later; --steps {fits} ends in the {format_duration(planned_s)} the recipe was "
            "sized for, with a less trained network."
        )
    assert time_limit_s is not None
    return (
        f"{head}: the {time_limit_s:g}s time limit makes about {int(rate * time_limit_s)} steps "
        f"instead of {int(expected * time_limit_s)}, so the network learns less; --steps N "
        "trains N steps whatever the speed."
    )


class TrainProgress:
    """Progress of one run, updated after every embedding update with the cumulative step
    count and training seconds (a resumed run starts at its ``initial`` step and seconds)."""

    def __init__(
        self,
        *,
        total_steps: int | None,
        initial: int = 0,
        initial_seconds: float = 0.0,
        time_limit_s: float | None = None,
        expected_steps_per_s: float | None = None,
        enabled: bool = True,
        bar: bool | None = None,
        every_s: float = 10.0,
        out: TextIO | None = None,
    ) -> None:
        self.total = total_steps
        self.time_limit_s = time_limit_s
        self.expected = expected_steps_per_s
        self.enabled = enabled
        self.out = out if out is not None else sys.stderr
        self.every_s = every_s
        self.meter = RateMeter()
        self.meter.update(initial, initial_seconds)
        self.shown = initial  # steps the bar has been told about (a disabled tqdm counts none)
        self.warned = False
        self.last_line_s: float | None = None
        self.bar = tqdm(
            total=total_steps,
            initial=initial,
            desc="train",
            unit="step",
            disable=not (enabled and (self.out.isatty() if bar is None else bar)),
            dynamic_ncols=True,
            file=self.out,
        )

    def update(self, step: int, train_seconds: float, loss: float, images_per_s: float) -> None:
        """After the update that made ``step`` steps, ``train_seconds`` into training."""
        self.meter.update(step, train_seconds)
        self.bar.update(step - self.shown)
        self.shown = step
        self.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{images_per_s:.1f}", refresh=False)
        if not self.enabled:
            return
        self._check_rate()
        if self.bar.disable and self._line_due(train_seconds):
            self.last_line_s = train_seconds
            print(self.line(step, loss, images_per_s), file=self.out, flush=True)

    def _line_due(self, seconds: float) -> bool:
        if self.meter.rate is None:
            return False
        return self.last_line_s is None or seconds - self.last_line_s >= self.every_s

    def line(self, step: int, loss: float, images_per_s: float) -> str:
        """``step 120/900 loss 0.1234 47.3 img/s 3.10 steps/s ETA 4m12s``."""
        total = self.total if self.total is not None else "?"
        text = f"step {step}/{total} loss {loss:.4f} {images_per_s:.1f} img/s"
        rate = self.meter.rate
        if rate is not None:
            text += f" {rate:.2f} steps/s"
            eta = self._eta()
            if eta is not None:
                text += f" ETA {format_duration(eta)}"
        return text

    def _eta(self) -> float | None:
        rate = self.meter.rate
        if rate is None:
            return None
        left = []
        if self.total is not None:
            left.append((self.total - self.meter.done) / rate)
        if self.time_limit_s is not None:
            left.append(self.time_limit_s - self.meter.seconds)
        return max(0.0, min(left)) if left else None

    def _check_rate(self) -> None:
        """One note, the first time the rate stands on enough steps and seconds and is much
        below the expected one."""
        if self.warned or not self.expected:
            return
        steps, seconds = self.meter.measured
        rate = self.meter.rate
        if steps < SLOW_CHECK_MIN_STEPS or seconds < SLOW_CHECK_MIN_SECONDS or rate is None:
            return
        if much_slower(rate, self.expected):
            self.warned = True
            self.bar.clear()
            note = slow_machine_note(
                rate,
                self.expected,
                done=self.meter.done,
                total_steps=self.total,
                time_limit_s=self.time_limit_s,
            )
            print(note, file=self.out, flush=True)
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
        steps, seconds = self.meter.done, self.meter.seconds
        if self.enabled and self.bar.disable and steps:
            rate = self.meter.rate
            at = f" ({rate:.2f} steps/s after start-up)" if rate is not None else ""
            print(f"train: {steps} steps in {seconds:.1f}s of training{at}", file=self.out)
