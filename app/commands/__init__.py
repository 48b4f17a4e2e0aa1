"""The subcommands of ``nearsight``, in the order ``--help`` lists them.

Each module has ``register(subparsers)``, which adds its parser and sets ``func`` on it.
"""

from __future__ import annotations

from app.commands import data, export, train

COMMANDS = [data, train, export]
