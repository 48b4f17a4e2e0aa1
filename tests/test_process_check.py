"""tests/process_check.py: a run that leaves a process behind fails, names it and kills it; a
run that stops what it starts (helpers.started) passes. Each case is a pytest run of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT, started

HEADER = """
import subprocess, sys
from helpers import started
SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)  # {tag}"]
"""


# the run in one process, and spread over two pytest-xdist workers (as `make test` runs)
MODES = pytest.mark.parametrize(
    "workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["one-process", "xdist"]
)


def run_pytest(tmp_path: Path, body: str, workers: list[str]) -> subprocess.CompletedProcess:
    """``pytest test_case.py`` in ``tmp_path`` with only the check as a plugin (none of the
    project's conftest files, no plugin loaded by its entry point: they take seconds to import),
    its tests on ``workers`` (pytest-xdist's ``-n N``, or none); the test file gets ``HEADER``
    and ``body``."""
    tag = f"leftover-{tmp_path.name}"
    (tmp_path / "pytest.ini").write_text("[pytest]\nprocess_check_grace_s = 1\n")
    (tmp_path / "test_case.py").write_text(HEADER.format(tag=tag) + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "process_check", "-p", "no:cacheprovider",
         "-q", *workers, "test_case.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def running(tag: str) -> list[int]:
    """Pids of the running processes whose command line holds ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag.encode() in (entry / "cmdline").read_bytes():
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
                found.append(int(entry.name)) if state != "Z" else None
        except OSError:
            continue
    return found


@MODES
def test_a_child_left_running_fails_the_run_and_is_killed(tmp_path, workers):
    result = run_pytest(tmp_path, """
        def test_leaves_a_child():
            subprocess.Popen(SLEEPER)
    """, workers)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 passed" in out  # the test itself passed: the check failed the run
    assert "1 process(es) started by the tests still ran at the end (now killed)" in out
    assert f"leftover-{tmp_path.name}" in out  # its command line is named
    assert running(f"leftover-{tmp_path.name}") == []


@MODES
def test_an_orphan_adopted_by_init_is_found_by_its_mark(tmp_path, workers):
    """The child starts a grandchild and exits: the grandchild is no descendant of pytest any
    more, but it carries the run's mark in its environment."""
    result = run_pytest(tmp_path, """
        def test_leaves_an_orphan():
            subprocess.run([sys.executable, "-c",
                            "import subprocess, sys; subprocess.Popen(sys.argv[1:])", *SLEEPER],
                           check=True)
    """, workers)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 process(es) started by the tests still ran" in out and "1 passed" in out
    assert running(f"leftover-{tmp_path.name}") == []


@MODES
def test_a_run_that_stops_what_it_starts_passes(tmp_path, workers):
    result = run_pytest(tmp_path, """
        def test_stops_its_child():
            with started(SLEEPER) as process:
                assert process.poll() is None

        def test_a_child_that_exits_on_its_own():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    """, workers)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "2 passed" in out and "still ran" not in out


@pytest.mark.parametrize("ignore_term", [False, True])
def test_started_stops_a_process_that_ignores_sigint_and_even_sigterm(ignore_term):
    """What ``nohup make test &`` hands the processes it starts: SIGINT ignored. SIGTERM stops
    them; one that ignores SIGTERM too is killed after the timeout."""
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True); time.sleep(300)"
    begin = time.monotonic()
    with started([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                 timeout=2) as process:  # fmt: skip
        assert process.stdout.readline() == "ready\n"
    assert process.returncode == (-9 if ignore_term else -15)
    assert time.monotonic() - begin < 30
