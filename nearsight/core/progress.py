"""Progress for long work: a tqdm bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(
    iterable: Iterable[T],
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    every_s: float = 10.0,
) -> Iterator[T]:
    """Iterate ``iterable`` showing progress on stderr: a bar when stderr is a terminal, else a
    plain line at most every ``every_s`` seconds and one at the end."""
    if sys.stderr.isatty():
        yield from tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True)
        return
    start = last = time.perf_counter()
    done = 0
    for item in iterable:
        yield item
        done += 1
        now = time.perf_counter()
        if now - last >= every_s:
            last = now
            of = f"/{total}" if total is not None else ""
            print(
                f"{desc}: {done}{of} {unit} ({done / (now - start):.1f} {unit}/s)",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.perf_counter() - start
    print(f"{desc}: {done} {unit} in {elapsed:.1f}s", file=sys.stderr, flush=True)


# "much slower than expected": a machine at under half the rate a run was sized for
SLOW_FACTOR = 2.0


def much_slower(measured_per_s: float, expected_per_s: float, factor: float = SLOW_FACTOR) -> bool:
    """Whether work measured at ``measured_per_s`` runs ``factor`` times or more below the
    ``expected_per_s`` it was sized for."""
    return measured_per_s * factor <= expected_per_s


def format_duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``: an ETA's precision."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class RateMeter:
    """Units of work per second on the caller's own clock (a trainer passes its training
    seconds, which leave evaluations out). The first ``skip`` units after the first update are
    start-up (worker processes, first allocations), so the rate is measured from there on."""

    def __init__(self, skip: int = 5) -> None:
        self.skip = skip
        self.origin: tuple[int, float] | None = None  # (done, seconds) where measuring began
        self.first: int | None = None
        self.done = 0
        self.seconds = 0.0

    def update(self, done: int, seconds: float) -> None:
        """``done`` units finished after ``seconds`` (both cumulative)."""
        if self.first is None:
            self.first = done
        if self.origin is None and done - self.first >= self.skip:
            self.origin = (done, seconds)
        self.done, self.seconds = done, seconds

    @property
    def measured(self) -> tuple[int, float]:
        """(units, seconds) the rate stands on; (0, 0.0) while still in start-up."""
        if self.origin is None:
            return 0, 0.0
        return self.done - self.origin[0], self.seconds - self.origin[1]

    @property
    def rate(self) -> float | None:
        """Units per second since start-up; None before any has been timed."""
        units, seconds = self.measured
        return units / seconds if units > 0 and seconds > 0 else None

    def eta(self, total: int) -> float | None:
        """Seconds until ``total`` units at the measured rate."""
        rate = self.rate
        return None if rate is None else max(0, total - self.done) / rate
