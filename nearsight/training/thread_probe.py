"""A CPU training run's thread count, measured while it trains (``cpu_threads: measured``).

torch runs one intra-op thread per core by default. When other work holds some of the cores,
those threads wait for each other at every operator's end, and a step can take longer than on
fewer threads. A run set to ``measured`` times its steps at each candidate count (all the
cores, half of them, one), keeps the fastest, and measures again every ``every`` steps, as the
machine's load changes. The counts take turns step by step, so a drift during the probe (the
first steps' warm-up, another job starting) weighs on each alike, and fewer threads must be
clearly faster (``MARGIN``) to be kept. Every step it times is a real training step: nothing
runs twice, and the probe's cost is the few steps it runs at the slower counts.
"""

from __future__ import annotations

import statistics
import sys

import torch

SKIP_STEPS = 10  # the first steps allocate and warm up: not timed
MARGIN = 0.9  # fewer threads are kept only when their median step is under 0.9x of more threads'
STEPS_EACH = 3  # steps timed at each candidate count (their median counts)
EVERY = 100  # steps between two probes


class ThreadProbe:
    """Sets torch's intra-op threads before each step and learns from each step's seconds."""

    def __init__(self, cores: int, *, steps_each: int = STEPS_EACH, every: int = EVERY) -> None:
        self.cores = max(1, cores)
        self.choices = sorted({self.cores, max(1, self.cores // 2), 1}, reverse=True)
        self.steps_each, self.every = steps_each, every
        self.chosen = self.cores
        self._plan: list[int] = []
        self._times: dict[int, list[float]] = {}
        self._next_probe: int | None = None  # the step the next probe starts at

    def before_step(self, step: int) -> None:
        """Set the thread count for the step about to run (``step`` steps done so far)."""
        if self._next_probe is None:
            self._next_probe = step + SKIP_STEPS
        if not self._plan and step >= self._next_probe and len(self.choices) > 1:
            self._plan = [n for _ in range(self.steps_each) for n in self.choices]
            self._times = {n: [] for n in self.choices}
        torch.set_num_threads(self._plan[0] if self._plan else self.chosen)

    def after_step(self, step: int, seconds: float) -> None:
        """Record the seconds the step set by :meth:`before_step` took; ``step``: steps done
        now. The probe's last step chooses the count for the steps until the next probe."""
        if not self._plan:
            return
        self._times[self._plan.pop(0)].append(seconds)
        if self._plan:
            return
        medians = {n: statistics.median(times) for n, times in self._times.items()}
        best = self.choices[0]  # from the most threads down: fewer only when clearly faster
        for n in self.choices[1:]:
            if medians[n] < MARGIN * medians[best]:
                best = n
        if best != self.chosen:
            shown = ", ".join(f"{medians[n]:.2f} s at {n}" for n in self.choices)
            why = "again" if best == self.cores else "(other work may hold cores)"
            print(f"nearsight: note: training on {best} of {self.cores} CPU threads from step "
                  f"{step}, the fastest steps now {why}: a step took {shown}",
                  file=sys.stderr)  # fmt: skip
        self.chosen = best
        self._next_probe = step + self.every
