"""The subcommands of ``nearsight``, in the order ``--help`` lists them.

Each module has ``register(subparsers)``, which adds its parser and sets ``func`` on it.
"""

from __future__ import annotations

from nearsight.app.commands import (
    data,
    demo,
    eval,
    export,
    index,
    inspect,
    models,
    reproduce,
    rerank,
    search,
    serve,
    train,
)

COMMANDS = [
    demo,
    data,
    train,
    export,
    index,
    eval,
    search,
    serve,
    models,
    reproduce,
    rerank,
    inspect,
]
