"""Where a training step's time goes: torch.profiler over a few of the real trainer's batches,
broken down by the trainer's own ranges (``nearsight.forward``, ``.loss``, ``.backward``,
``.optimizer``, RankMI's ``.critic``), the device's busy and idle time, and the top kernels.

Used by bench/gpu_check_train.py: :class:`StepProfiler` wraps ``Trainer._train_step`` for one
run and profiles batches ``start`` .. ``start + batches - 1`` (from the start of one to the
start of the next, so the host's work between steps is inside the window).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

PHASES = ("forward", "loss", "backward", "optimizer", "critic")
TOP_OPS = 8


class StepProfiler:
    """Profiles ``batches`` trainer batches from the ``start``-th call (1-based)."""

    def __init__(self, start: int, batches: int, cuda: bool):
        self.start, self.batches, self.cuda = start, batches, cuda
        self.calls = 0
        self.result: dict[str, Any] | None = None
        self._profile: profile | None = None
        self._began = 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _begin(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._sync()
        self._profile = profile(activities=activities)
        self._profile.__enter__()
        self._began = time.perf_counter()

    def _end(self) -> None:
        assert self._profile is not None
        self._sync()
        wall = time.perf_counter() - self._began
        self._profile.__exit__(None, None, None)
        self.result = breakdown(self._profile, wall, self.batches, self.cuda)
        self._profile = None

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def profiled_step(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            try:  # a profiler that cannot start or read its trace costs the profile only
                if self.calls == self.start:
                    self._begin()
                elif self.calls == self.start + self.batches and self._profile is not None:
                    self._end()
            except Exception as error:
                self._profile = None
                self.result = {"error": f"{type(error).__name__}: {error}"[:300]}
            return step(trainer, *args, **kwargs)

        return profiled_step


@contextmanager
def profiled_trainer(profiler: StepProfiler) -> Iterator[None]:
    """``Trainer._train_step`` wrapped by ``profiler`` for the duration."""
    from nearsight.training.trainer import Trainer

    original = Trainer._train_step
    Trainer._train_step = profiler.wrap(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer._train_step = original  # type: ignore[method-assign]


def _is_kernel(event: Any) -> bool:
    device = getattr(event, "device_type", None)
    if device is None or device == torch.autograd.DeviceType.CPU:
        return False
    return not getattr(event, "is_user_annotation", False) and not event.name.startswith(
        "nearsight."
    )


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals (µs)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def breakdown(prof: profile, wall_s: float, batches: int, cuda: bool) -> dict[str, Any]:
    """Per batch: wall ms; each phase's host ms and device ms; the device's busy and idle
    shares of the wall time; the top ops by device time (by host time on a CPU)."""
    events = prof.events()
    wall_ms = 1000.0 * wall_s / batches
    cpu = torch.autograd.DeviceType.CPU
    ranges = [
        (e.time_range.start, e.time_range.end, e.name.removeprefix("nearsight."))
        for e in events
        if e.name.startswith("nearsight.") and e.device_type == cpu
    ]
    host_us = dict.fromkeys(PHASES, 0.0)
    device_us = dict.fromkeys((*PHASES, "other"), 0.0)
    for start, end, phase in ranges:
        host_us[phase] = host_us.get(phase, 0.0) + end - start
    # a kernel counts for the phase during which its op started on the host, whatever thread
    # launched it (the autograd engine runs CUDA backward on a thread of its own)
    for event in events:
        own = getattr(event, "self_device_time_total", 0.0) or 0.0
        if event.device_type != cpu or not own or event.name.startswith("nearsight."):
            continue
        at = event.time_range.start
        phase = next((name for s0, s1, name in ranges if s0 <= at < s1), "other")
        device_us[phase] += own
    phases = {
        phase: {
            "host_ms": round(host_us.get(phase, 0.0) / 1000 / batches, 3),
            "device_ms": round(device_us[phase] / 1000 / batches, 3),
        }
        for phase in (*PHASES, "other")
        if host_us.get(phase) or device_us[phase]
    }
    kernels = [(e.time_range.start, e.time_range.end) for e in events if _is_kernel(e)]
    # no kernel in the trace on CUDA: the profiler saw no device activity (CUPTI unavailable)
    busy_ms = _busy_us(kernels) / 1000 / batches if cuda and kernels else None
    by_device = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = sorted(
        prof.key_averages(), key=lambda a: getattr(a, by_device, 0.0) or 0.0, reverse=True
    )
    top = [
        {
            "op": a.key[:80],
            "ms_per_batch": round((getattr(a, by_device, 0.0) or 0.0) / 1000 / batches, 3),
            "calls_per_batch": round(a.count / batches, 1),
        }
        for a in averages
        if not a.key.startswith("nearsight.") and not a.key.startswith("ProfilerStep")
    ][:TOP_OPS]
    result: dict[str, Any] = {
        "batches": batches,
        "wall_ms_per_batch": round(wall_ms, 3),
        "phases": phases,
        "device_busy_ms_per_batch": None if busy_ms is None else round(busy_ms, 3),
        "device_idle_share": None if busy_ms is None else round(max(0.0, 1 - busy_ms / wall_ms), 3),
        "top_ops": top,
    }
    for phase, times in phases.items():
        key = "device_ms" if cuda else "host_ms"  # on a CPU the host's time is the device's
        result[f"{phase}_share"] = round(times[key] / wall_ms, 3) if wall_ms else None
    return result


def describe(profile_result: dict[str, Any] | None) -> str:
    """One line for the table: each phase's share of the batch and the device's idle share."""
    if not profile_result:
        return "no profile"
    if "error" in profile_result:
        return f"no profile ({profile_result['error']})"
    shares = [
        f"{p} {profile_result[f'{p}_share']:.0%}"
        for p in (*PHASES, "other")
        if profile_result.get(f"{p}_share") is not None
    ]
    idle = profile_result.get("device_idle_share")
    if idle is not None:
        shares.append(f"device idle {idle:.0%}")
    return f"{profile_result['wall_ms_per_batch']:.1f} ms/batch: " + ", ".join(shares)
