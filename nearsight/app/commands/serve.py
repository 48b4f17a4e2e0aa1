"""``nearsight serve``: the page and the REST API over one or more galleries; its flags are
made from :class:`nearsight.app.serve.settings.Settings` (one per field, with its default and
help), and so are the NEARSIGHT_* variables and the keys of ``--config FILE``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from nearsight.app.commands.rerank_option import RERANK_HELP, rerank_type
from nearsight.app.serve.settings import ENV_PREFIX, Settings, fields, flag_of, kind_of


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the search page (Gradio) and the REST API over one or more galleries",
        description="Serve a web page to query the galleries by image: the top-k framed green "
        "(the query's class) or red (another class), the gallery's leave-one-out failures and "
        "its Recall@k; and the REST API under /api. Prints the URL and serves until "
        "interrupted. Every flag can also be set by the NEARSIGHT_<NAME> environment variable "
        "or a key of --config (a flag wins over the variable, the variable over the file).",
    )
    parser.add_argument("--config", type=Path, metavar="FILE.toml",
                        help="read settings from this TOML file (keys: the flags' names)")  # fmt: skip
    add_settings_flags(parser)
    parser.set_defaults(func=run_serve)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of Settings; a flag not given is None (the file, the environment or
    the default decide)."""
    defaults = Settings()
    for spec in fields():
        kind, meta = kind_of(spec), spec.metadata
        flag = flag_of(spec.name)
        default = getattr(defaults, spec.name)
        env = f"; env {ENV_PREFIX}{spec.name.upper()}" if meta["env"] else ""
        shown = (
            ""
            if default in (None, "", []) or kind is bool
            else f" (default {default:g})"
            if isinstance(default, float)
            else f" (default {default})"
        )
        help_text = meta["help"] + shown + env
        options: dict[str, Any] = {"dest": spec.name, "default": None, "help": help_text}
        if spec.name == "rerank":
            options.update(type=_rerank_text, help=RERANK_HELP + env)
        if kind is bool:
            options["action"] = "store_false" if default else "store_true"
        elif kind is list:
            options.update(action="append", type=Path)
        else:
            options.setdefault("type", Path if kind is Path else kind)
        if meta.get("metavar"):
            options["metavar"] = meta["metavar"]
        if meta.get("choices"):
            options["choices"] = meta["choices"]
        parser.add_argument(flag, **options)


def _rerank_text(text: str) -> str:
    rerank_type(text)  # checked here: a one-line error naming the flag
    return text


def settings_of(args: argparse.Namespace) -> Settings:
    given = {spec.name: getattr(args, spec.name) for spec in fields()}
    return Settings.load(given, config_file=getattr(args, "config", None))


def run_serve(args: argparse.Namespace) -> int:
    from nearsight.app.server_app import serve

    serve(settings_of(args))
    return 0
