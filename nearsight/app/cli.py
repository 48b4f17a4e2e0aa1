"""The ``nearsight`` command line.

Each subcommand lives in its own module under ``nearsight/app/commands`` with two functions:
``register(subparsers)`` adds its parser and sets ``func``; the parsed namespace is then passed
to that ``func``. Bad input raises :class:`nearsight.core.errors.NearsightError`: the message is printed
as one line on stderr and the exit status is 2, never a traceback. So is an OSError (a full
disk, no permission): a fault of the machine, not of the code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from nearsight.app.commands import COMMANDS
from nearsight.core.errors import NearsightError
from nearsight.core.extras import missing_extra
from nearsight.core.threads import worker_threads


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nearsight",
        description="Image retrieval built on deep metric learning: "
        "train an embedding, export it to ONNX, index a gallery with FAISS, search and serve it.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    share_the_cores()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NearsightError as error:
        print(f"nearsight: error: {error}", file=sys.stderr)
        return error.exit_code
    except ModuleNotFoundError as error:  # train, export, a .pt, CARS with the serving set only
        line = missing_extra(error)
        if line is None:
            raise
        print(f"nearsight: error: nearsight {args.command}: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nearsight: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `nearsight search ... | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as error:
        # the machine rather than the code: a full disk, a quota, no permission, a file where
        # a folder should be. Writes are atomic, so nothing was left half-written.
        print(f"nearsight: error: {_os_error_line(error)}", file=sys.stderr)
        return 2


def share_the_cores() -> None:
    """Several processes on one machine (LOCAL_WORLD_SIZE, from torchrun or another launcher):
    OpenMP (torch, FAISS) takes this process's share of the cores, unless OMP_NUM_THREADS is
    set already. onnxruntime reads the same share (nearsight/core/threads.py)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(worker_threads())


def _os_error_line(error: OSError) -> str:
    if error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
