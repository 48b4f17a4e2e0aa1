"""The ``nearsight`` command line.

Each subcommand lives in its own module under ``app/commands`` with two functions:
``register(subparsers)`` adds its parser and sets ``func``; the parsed namespace is then passed
to that ``func``. Bad input raises :class:`models.errors.NearsightError`: the message is printed
as one line on stderr and the exit status is 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app.commands import COMMANDS
from models.errors import NearsightError


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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NearsightError as error:
        print(f"nearsight: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("nearsight: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `nearsight search ... | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
