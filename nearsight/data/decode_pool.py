"""The decode box's warm workers (nearsight/data/decode_box.py): started, handed out one image
at a time, replaced when one is killed.

Two kinds of caller wait for a worker: those with priority (clients without recent decode
failures, and every caller where nothing charges decodes) and the others. A free worker goes
to a priority caller first, and a ready worker before one still starting, so a client whose
images hit the limits takes what is left: the worker a failure of its own left starting."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

from nearsight.core.errors import NearsightError
from nearsight.data import decode_worker as wire
from nearsight.data.decode_process import WORKER_LOG_ENV, Worker
from nearsight.data.images import ImageLoadError
from nearsight.data.pipe_io import Late, receive_by

START_TIMEOUT_S = 60.0  # a worker's imports, on a loaded machine


class WorkerPool:
    """Worker processes, each limited to ``memory_mb`` MB above its imports and (as a kernel
    backstop) CPU time past ``timeout_s``; idle ones wait here for the next image."""

    def __init__(self, memory_mb: int, timeout_s: float) -> None:
        self.memory_mb, self.timeout_s = memory_mb, timeout_s
        self._idle: list[Worker] = []
        self._changed = threading.Condition()
        self._priority_waiting = 0  # callers with priority waiting for a worker
        self._all: set[Worker] = set()
        self._closed = False
        self.replaced = 0  # workers killed (late, out of memory, crashed) and started again

    def __len__(self) -> int:
        return len(self._all)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pids(self) -> list[int]:
        with self._changed:
            return sorted(worker.process.pid for worker in self._all)

    def grow(self, workers: int) -> None:
        """Start workers until there are ``workers`` (they warm up in the background)."""
        with self._changed:
            while len(self._all) < workers and not self._closed:
                self._start()

    def _start(self) -> None:  # with self._changed held
        worker = Worker(self.memory_mb, self.timeout_s)
        self._all.add(worker)
        self._idle.append(worker)
        self._changed.notify_all()

    def warm(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the idle workers have started."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            idle, self._idle = self._idle, []
        for worker in idle:
            if not worker.ready:
                started(worker, deadline)
        self.give_back(*idle)

    def give_back(self, *workers: Worker) -> None:
        """Workers that finished an image, idle again."""
        with self._changed:
            self._idle.extend(w for w in workers if w in self._all)
            self._changed.notify_all()

    def replace(self, worker: Worker) -> None:
        """Kill ``worker`` and start another in its place."""
        worker.kill()
        with self._changed:
            self._all.discard(worker)
            self.replaced += 1
            if not self._closed:
                self._start()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            workers, self._all, self._idle = list(self._all), set(), []
            self._changed.notify_all()
        for worker in workers:
            worker.kill()

    def take(self, deadline: float, name: str, priority: bool = True) -> Worker:
        """An idle worker that is alive and ready, by ``deadline`` (one that died while idle,
        or did not start, is replaced; three in a row that do not start are an error)."""
        code = None
        for _ in range(3):
            worker = self._wait_for_idle(deadline, name, priority)
            if worker.process.poll() is None and (worker.ready or started(worker, deadline)):
                return worker
            code = worker.process.poll()
            if code is None and time.monotonic() >= deadline:  # still starting: keep it
                self.give_back(worker)
                raise ImageLoadError.for_file(name, "the image decoder did not start within "
                                              f"the limit of {self.timeout_s:g} s: retry")  # fmt: skip
            self.replace(worker)
        raise NearsightError(
            f"the image decoder did not start (exit code {code}; set {WORKER_LOG_ENV}=FILE "
            "to keep its messages)"
        )

    def _wait_for_idle(self, deadline: float, name: str, priority: bool) -> Worker:
        """The next idle worker for this caller: priority callers first, each taking a ready
        worker where there is one; the others take one still starting where there is one."""
        with self._changed:
            self._priority_waiting += priority
            try:
                while True:
                    if self._closed:
                        raise NearsightError("the decode box is closed")
                    if self._idle and (priority or not self._priority_waiting):
                        ready = [w for w in self._idle if w.ready == priority]
                        worker = (ready or self._idle)[0]
                        self._idle.remove(worker)
                        return worker
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ImageLoadError.for_file(name, "no image decoder was free within "
                                                      f"the limit of {self.timeout_s:g} s: retry")  # fmt: skip
                    self._changed.wait(left)
            finally:
                self._priority_waiting -= priority


def started(worker: Worker, deadline: float) -> bool:
    """Wait for a new worker's imports (it says when it is ready), at most until ``deadline``
    or :data:`START_TIMEOUT_S`."""
    deadline = min(deadline, time.monotonic() + START_TIMEOUT_S)
    try:
        worker.ready = receive_by(worker.from_worker, 1, deadline) == wire.READY
    except Late:
        return False  # not yet: the caller keeps it if it is alive
    except (EOFError, OSError):
        worker.ready = False
    return worker.ready


def killed_outside(worker: Worker) -> bool:
    """Whether ``worker`` was killed by SIGKILL (by an operator or the kernel, never by its own
    limits: those end in a MemoryError answer or SIGXCPU), or closed its pipe unread."""
    try:
        code = worker.process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return False
    return code == -signal.SIGKILL
