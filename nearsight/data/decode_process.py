"""One worker process of the decode box (nearsight/data/decode_box.py), as the box holds it:
started as ``python -m nearsight.data.decode_worker``, its pipes non-blocking and large, killed
and reaped in one call."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from pathlib import Path

WORKER_LOG_ENV = "NEARSIGHT_DECODE_WORKER_LOG"
PIPE_BYTES = 1 << 20  # Linux's largest pipe buffer for an unprivileged process
MALLOC_MMAP_BYTES = 4 << 20  # a worker's allocations below this come from its heap
MALLOC_TRIM_BYTES = 16 << 20  # at most this much freed heap stays mapped


class Worker:
    def __init__(self, memory_mb: int, timeout_s: float):
        cpu_s = 2 * timeout_s + 5  # the kernel's backstop, past the box's own wall-time limit
        log = os.environ.get(WORKER_LOG_ENV)  # where a worker's stderr goes (debugging)
        with open(log or os.devnull, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nearsight.data.decode_worker", str(memory_mb),
                 str(cpu_s)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                close_fds=True, cwd="/", env=_worker_env(),
            )  # fmt: skip
        assert self.process.stdin is not None and self.process.stdout is not None
        self.to_worker = self.process.stdin.fileno()
        self.from_worker = self.process.stdout.fileno()
        os.set_blocking(self.to_worker, False)  # a stuck worker cannot block a write past
        os.set_blocking(self.from_worker, False)  # the deadline
        for fd in (self.to_worker, self.from_worker):
            # a whole answer (a few hundred KB) in one write: no wake-up per 64 KB
            with contextlib.suppress(OSError, AttributeError):
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.ready = False

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:  # always set (opened as PIPE); typed as optional
                    pipe.close()
        self.process.wait()


def _worker_env() -> dict[str, str]:
    """The worker imports this nearsight, wherever the caller's working folder is."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    # one thread per library: a thread pool reserves address space (stacks, arenas) the limit
    # counts, and a worker decodes one image at a time anyway
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env["MALLOC_ARENA_MAX"] = "1"
    # each image's buffers (a few hundred KB) are reused from the heap, not mapped and unmapped
    # again (page faults on every request; glibc's default thresholds adapt to each free);
    # larger ones are still given back when freed, and at most 16 MB of freed heap stays
    # mapped against the worker's memory limit
    env["MALLOC_MMAP_THRESHOLD_"] = str(MALLOC_MMAP_BYTES)
    env["MALLOC_TRIM_THRESHOLD_"] = str(MALLOC_TRIM_BYTES)
    return env
