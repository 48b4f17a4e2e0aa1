"""Processes the tests start: the page and `nearsight serve` in subprocesses, stopped and
measured; a wheel of the checkout; torchrun."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers.paths import ROOT


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(
    args: list[str], scratch: Path, *, env: dict[str, str] | None = None, **run: Any
) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node 2 *args`` (CPU processes, gloo), its temporary
    files under ``scratch`` (a test's tmp_path): torchelastic leaves a run folder in TMPDIR
    each time, which would pile up in /tmp."""
    launcher = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**(os.environ if env is None else env), "TMPDIR": str(scratch)}
    command = [launcher, "--standalone", "--nproc_per_node", "2", *args]
    return subprocess.run(command, env=env, **run)


def build_wheel(out: Path) -> Path:
    """`pip wheel` of a copy of the checkout (the build writes build/ and egg-info into the
    source folder, so not into the checkout); returns the wheel's path."""
    source = out / "source"
    anywhere = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.onnx")
    top_only = {".venv", ".git", "build", "dist", ".pytest_cache", ".ruff_cache", "runs", "data",
                "test-artifacts", ".whl"}  # fmt: skip

    def skip(folder: str, names: list[str]) -> set[str]:
        # runs/ and data/ at the top are a user's; nearsight/data/ is a package
        return anywhere(folder, names) | (top_only & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, source, ignore=skip)
    wheels = out / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = wheels.glob("nearsight-*.whl")
    return wheel


@contextlib.contextmanager
def running_page(galleries: list[Path], *, analyse: bool = True, **options):
    """The page and its REST API served on a free port for a test: yields (url, app), then
    stops the server, the API's batcher and the page's analysis threads. ``analyse``: wait for
    the galleries' analysis first (False: start none); ``options`` are fields of the server's
    Settings (no access log and no watching unless given)."""
    from nearsight.app.page.layout import build_app
    from nearsight.app.server_app import launch_app, stop_app

    demo = build_app(galleries, device="cpu", analyse=analyse)
    url = launch_app(demo, server_settings(**options))
    try:
        if analyse:
            assert demo.nearsight.wait_analysis(timeout=120)
        yield url, demo
    finally:
        stop_app(demo)


def server_settings(**options: Any) -> Any:
    """The server's Settings for a test: a free port of 127.0.0.1, no access log, no watching
    of the galleries' files, and ``options``."""
    from nearsight.app.serve.settings import Settings

    defaults = {"port": free_port(), "access_log": False, "watch_interval": 0.0}
    return Settings(**{**defaults, **options})


def stop_process(process: subprocess.Popen, timeout: float = 30) -> int:
    """Stop a process a test started, and wait for it: SIGTERM, then SIGKILL if it has not
    exited ``timeout`` s later. Returns its exit code (``-signal.SIGKILL`` when it had to be
    killed). Never SIGINT: a job started with ``&`` (``nohup make test &``) ignores SIGINT, and
    so does every process it starts."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextlib.contextmanager
def started(argv: list, *, timeout: float = 30, **popen: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(argv, **popen)`` for the block; however the block ends, the process
    is stopped with :func:`stop_process` (a test that kills it itself leaves nothing to do)."""
    process = subprocess.Popen([str(arg) for arg in argv], **popen)
    try:
        yield process
    finally:
        stop_process(process, timeout)


@contextlib.contextmanager
def serve_process(args: list, *, env: dict | None = None, stderr: Any = subprocess.DEVNULL):
    """``nearsight serve ARGS`` in a process of its own on a free port of 127.0.0.1, once its
    ``/api/health`` answers (at most 120 s): yields (url, process), then stops it
    (:func:`stop_process`)."""
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "nearsight.app.cli", "serve", "--port", port,
            "--analysis-max-items", "0", *args]  # fmt: skip
    env = {**os.environ, **(env or {})}
    with started(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True) as process:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                    break
            assert process.poll() is None, "the server exited"
            time.sleep(0.2)
        yield url, process


def process_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory now (VmRSS) or at its peak (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def disk_mb(folder: str | os.PathLike) -> float:
    """Megabytes of the files under ``folder`` now (files that vanish meanwhile count 0)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total / 1e6
