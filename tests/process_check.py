"""A test run fails when a test leaves a process of its own behind (a pytest plugin: the root
conftest.py loads it; ``-p process_check`` loads it anywhere ``tests/`` is on the path).

A process of the run's own is one started while it ran: a descendant of the pytest process, or
any process whose environment carries :data:`MARK` with this run's pid. The mark is inherited
by every process a test starts and by theirs, so it also finds an orphan that its parent left
and init adopted, which no walk down from pytest reaches. At the end of the session (every
fixture torn down) such processes get ``process_check_grace_s`` (an ini setting) to exit; those still running are named,
killed (SIGKILL) and the run's exit status becomes 1 (tests failed).

Under pytest-xdist (``-n``) the workers keep the mark of the controller (the pytest process
that started them), and only the controller looks, once every worker has exited: what a test
on any worker started carries its mark, and a worker that does not exit is a leftover too."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

MARK = "NEARSIGHT_TEST_RUN"
# multiprocessing's helpers of the pytest process itself: they exit when it exits
OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("process_check_grace_s", "seconds a test's processes get to exit at the end "
                  "of the run before they count as left behind", default="10")  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _is_xdist_worker(config):  # a worker inherited its controller's mark: it stays
        os.environ[MARK] = str(os.getpid())  # before any test copies os.environ for a child


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session):
    """After every other sessionfinish: the fixtures' teardown, and xdist's of its workers."""
    result = yield
    if not _is_xdist_worker(session.config):
        _check(session)
    return result


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _check(session: pytest.Session) -> None:
    me = os.getpid()
    deadline = time.monotonic() + float(session.config.getini("process_check_grace_s"))
    while (left := leftovers(me)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    lines = [f"pid {pid}: {command}" for pid, command in sorted(left.items())]
    for pid in left:
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to signal
            os.kill(pid, signal.SIGKILL)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    title = f"{len(left)} process(es) started by the tests still ran at the end (now killed)"
    if reporter is not None:
        reporter.write_sep("!", title, red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print(title, *lines, sep="\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def leftovers(me: int) -> dict[int, str]:
    """{pid: command line} of the running processes started during run ``me`` (a pytest pid):
    its descendants, and every process marked ``MARK=me``. Zombies (exited, not yet reaped)
    and multiprocessing's helpers of ``me`` itself are not counted."""
    parents: dict[int, int] = {}
    marked: set[int] = set()
    mark = f"{MARK}={me}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            # the command name may hold spaces and parentheses: the fields follow the last ")"
            state, ppid = (entry / "stat").read_text().rpartition(")")[2].split()[:2]
            if state == "Z":
                continue
            parents[pid] = int(ppid)
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                marked.add(pid)
        except (OSError, ValueError):  # exited meanwhile, or another user's
            continue
    found = marked | _descendants(me, parents)
    commands = {pid: _command(pid) for pid in found}
    return {
        pid: command
        for pid, command in commands.items()
        if command is not None
        and not (parents.get(pid) == me and any(name in command for name in OWN_HELPERS))
    }


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _command(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # exited meanwhile
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or f"[pid {pid}]"
