"""A CPU training run's thread count, measured while it trains (``cpu_threads: measured``).

torch runs one intra-op thread per core by default. When other work holds some of the cores,
those threads wait for each other at every operator's end, and a step can take longer than on
fewer threads. A run set to ``measured`` times its steps at each candidate count (all the
cores, half of them, one), keeps the fastest, and watches its steps afterwards: when their
time moves by more than ``DRIFT`` from what the probe measured (another job started or
ended), it measures again. Changing the count is not free (the first steps at a new count are
slow), so a probe runs each count's steps in a block, most threads first, judges by medians,
and keeps fewer threads only when they are clearly faster (``MARGIN``); a quiet machine is
probed once. Every step it times is a real training step: nothing runs twice.
"""

from __future__ import annotations

import collections
import statistics
import sys

import torch

SKIP_STEPS = 10  # the first steps allocate and warm up: not timed
STEPS_EACH = 3  # steps timed at each candidate count (their median counts)
MARGIN = 0.9  # fewer threads are kept only when their median step is under 0.9x of more's
DRIFT = 0.3  # steps 30% slower or faster than at the probe: the machine changed, probe again
RECENT = 10  # steps whose median is compared with the probe's


class ThreadProbe:
    """Sets torch's intra-op threads before each step and learns from each step's seconds."""

    def __init__(self, cores: int, *, steps_each: int = STEPS_EACH) -> None:
        self.cores = max(1, cores)
        self.choices = sorted({self.cores, max(1, self.cores // 2), 1}, reverse=True)
        self.steps_each = steps_each
        self.chosen = self.cores
        self._plan: list[int] = []
        self._times: dict[int, list[float]] = {}
        self._start: int | None = None  # the step the first probe starts at
        self._probed: float | None = None  # the chosen count's median step at the last probe
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT)

    def before_step(self, step: int) -> None:
        """Set the thread count for the step about to run (``step`` steps done so far)."""
        if self._start is None:
            self._start = step + SKIP_STEPS
        if not self._plan and len(self.choices) > 1 and self._due(step):
            self._plan = [n for n in self.choices for _ in range(self.steps_each)]
            self._times = {n: [] for n in self.choices}
            self._recent.clear()
        wanted = self._plan[0] if self._plan else self.chosen
        if wanted != torch.get_num_threads():  # setting it, even unchanged, rebuilds the pool
            torch.set_num_threads(wanted)

    def _due(self, step: int) -> bool:
        if self._probed is None:
            return step >= (self._start or 0)
        if len(self._recent) < RECENT:
            return False
        now = statistics.median(self._recent)
        return abs(now - self._probed) > DRIFT * self._probed

    def after_step(self, step: int, seconds: float) -> None:
        """Record the seconds the step set by :meth:`before_step` took; ``step``: steps done
        now. The probe's last step chooses the count for the steps after it."""
        if not self._plan:
            if self._probed is not None:
                self._recent.append(seconds)
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
        self._probed = medians[best]


def cpu_threads(setting: int | str, *, cuda: bool, world: int) -> ThreadProbe | None:
    """Apply the training config's ``cpu_threads`` on a CPU; the probe that measures them, for
    ``measured`` (one process: a distributed run keeps one thread per core)."""
    if cuda or setting == "cores":
        return None
    if setting != "measured":
        torch.set_num_threads(int(setting))
        return None
    if world > 1:
        return None
    from nearsight.core.threads import worker_threads

    return ThreadProbe(worker_threads())
