"""How a document's ``sh`` blocks run: each command in the document's copy of the small data
(tests/docs/workspace.py), as a user would type it, with four differences that keep the doc
tests quick and private to this machine:

- ``nearsight ...`` runs in this process (the CLI's ``main``), except ``nearsight serve``,
  which starts a real server on a free loopback port and stays up until the document ends;
- ``curl`` runs the real curl, its ``http://127.0.0.1:7860`` pointed at the latest server and
  ``--fail-with-body`` added, so an HTTP error fails the example;
- ``nearsight train`` gets :data:`SHORT_TRAINING` appended (later flags win): two steps of a
  ResNet-18 at 32 px, from scratch;
- any other program is refused: mark such a block ``<!-- not-run: REASON -->``.

The latest block's outputs are kept in :attr:`DocWorkspace.outputs`, for a check that
follows it; :meth:`DocWorkspace.cli` runs a command for such a check."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.docs.usage import ROOT, parse_command

DOC_URL = "http://127.0.0.1:7860"  # the address the docs show: nearsight serve's default
SHORT_TRAINING = ["--steps", "2", "--image-size", "32", "--dim", "8", "--pretrained", "none",
                  "--classes-per-batch", "4", "--per-class", "2", "--workers", "0",
                  "--set", "model.arch=resnet18"]  # fmt: skip
SERVER_START_S = 120  # a cold start on a busy 2-core machine, with room to spare


def commands(source: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    lines = source.replace("\\\n", " ").splitlines()
    return [argv for line in lines if (argv := shlex.split(line, comments=True))]


class DocWorkspace:
    """One document's copy of the small data, made when an example first needs it and then
    the working folder until the document ends; the servers it started; its outputs."""

    def __init__(self, make: Callable[[], Path]) -> None:
        self.repo = ROOT
        self.outputs: list[str] = []  # stdout of each command of the latest sh block
        self.blocks: list[list[list[str]]] = []  # each sh block's commands, run or not
        self._make = make
        self._path: Path | None = None
        self._cwd_before: str | None = None
        self._servers: list[tuple[subprocess.Popen, str]] = []

    @property
    def path(self) -> Path:
        """The document's copy, made on first use; the working folder from then on."""
        if self._path is None:
            self._path = self._make()
            self._cwd_before = os.getcwd()
            os.chdir(self._path)
        return self._path

    @property
    def url(self) -> str:
        """The address of the latest server this document started."""
        if not self._servers:
            raise AssertionError("no server: the document starts one with `nearsight serve`")
        return self._servers[-1][1]

    def server_log(self) -> str:
        """What the latest server wrote to stdout and stderr so far."""
        port = self.url.rsplit(":", 1)[1]
        return (self.path / f"serve-{port}.log").read_text()

    def run_block(self, source: str) -> None:
        self.blocks.append(commands(source))
        self.outputs = []
        for argv in self.blocks[-1]:
            if argv[0] == "nearsight" and argv[1:2] == ["serve"]:
                self._serve(argv[1:])
            elif argv[0] == "nearsight":
                self._nearsight(argv[1:])
            elif argv[0] == "curl":
                self._curl(argv[1:])
            else:
                raise AssertionError(
                    f"`{shlex.join(argv)}`: the doc tests run nearsight and curl; "
                    "mark a block of other commands <!-- not-run: REASON -->"
                )

    def check_block(self, source: str) -> None:
        """The block's ``nearsight`` commands parsed by the CLI's parser, none run."""
        self.blocks.append(commands(source))
        problems = [
            problem
            for argv in self.blocks[-1]
            if argv[0] == "nearsight" and (problem := parse_command(argv[1:]))
        ]
        if problems:
            raise AssertionError("\n".join(problems))

    def close(self) -> None:
        from helpers import stop_process

        for process, _ in self._servers:
            stop_process(process)
        self._servers.clear()
        if self._cwd_before is not None:
            os.chdir(self._cwd_before)
            self._cwd_before = None

    def cli(self, *argv: object) -> tuple[int, str, str]:
        """``nearsight *argv`` in the working folder: (exit status, stdout, stderr). For the
        checks in a document's invisible blocks."""
        from nearsight.app.cli import main

        self.path  # noqa: B018 (the working folder)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(word) for word in argv])
            except SystemExit as exit:  # argparse: a flag it does not know
                code = exit.code
        return int(code or 0), out.getvalue(), err.getvalue()

    def _nearsight(self, argv: list[str]) -> None:
        if argv[:1] == ["train"]:
            argv = [*argv, *SHORT_TRAINING]
        code, out, err = self.cli(*argv)
        if code:
            raise AssertionError(f"`nearsight {shlex.join(argv)}` exited with {code}:\n{err}")
        self.outputs.append(out)

    def _serve(self, argv: list[str]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        log = open(self.path / f"serve-{port}.log", "w")  # noqa: SIM115 (the server writes it)
        process = subprocess.Popen(
            [sys.executable, "-m", "nearsight.app.cli", *argv, "--port", str(port)],
            cwd=self.path, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        url = f"http://127.0.0.1:{port}"
        self._servers.append((process, url))
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                text = (self.path / f"serve-{port}.log").read_text()
                raise AssertionError(f"`nearsight {shlex.join(argv)}` exited:\n{text}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/api/health", timeout=5),
            ):
                return
            time.sleep(0.2)
        raise AssertionError(f"`nearsight {shlex.join(argv)}` did not answer in {SERVER_START_S} s")

    def _curl(self, argv: list[str]) -> None:
        curl = shutil.which("curl")
        if curl is None:
            import pytest

            pytest.skip("curl is not installed")
        argv = [word.replace(DOC_URL, self.url) for word in argv]
        self.path  # noqa: B018 (the working folder)
        result = subprocess.run(
            [curl, "--silent", "--show-error", "--fail-with-body", *argv],
            cwd=self.path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if result.returncode:
            raise AssertionError(
                f"`curl {shlex.join(argv)}` exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        self.outputs.append(result.stdout)
