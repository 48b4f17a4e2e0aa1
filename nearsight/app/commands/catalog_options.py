"""The catalog options of ``index build``, ``import`` and ``add``: column types and keys."""

from __future__ import annotations

import argparse
from typing import Any


def add_catalog_options(parser: argparse.ArgumentParser, *, key_column: bool = True) -> None:
    """``--meta-types`` and ``--key-column``, of ``index build``, ``import`` and (types) ``add``."""
    parser.add_argument(
        "--meta-types",
        action="append",
        metavar="COL=TYPE,...",
        help="declare metadata column types (int, float, str), e.g. sku=str,price=float; "
        "undeclared columns are numeric only when every value in them is a number",
    )
    if not key_column:
        return
    parser.add_argument(
        "--key-column",
        metavar="NAME",
        help="the metadata column that holds each item's unique key (default: 'key' when the "
        "source has one): index add replaces an item with the same key, index remove --keys "
        "deletes by key",
    )


def catalog_settings(
    args: argparse.Namespace, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """Gallery meta from the catalog options: the column types and the checked key column."""
    from nearsight.index.chunks import meta_types_of
    from nearsight.index.gallery.keys import DEFAULT_KEY_COLUMN, check_unique_keys

    column = args.key_column
    if column is None and any(DEFAULT_KEY_COLUMN in (row.get("meta") or {}) for row in rows):
        column = DEFAULT_KEY_COLUMN
    settings: dict[str, Any] = {"meta_types": meta_types_of(rows)}
    if column is not None:
        check_unique_keys(rows, column)
        settings["key_column"] = column
    return settings


def declared_types(args: argparse.Namespace) -> dict[str, str]:
    """``--meta-types``, with the key column declared text (keys are names, not numbers)."""
    from nearsight.index.search.meta_types import parse_meta_types

    declared = parse_meta_types(args.meta_types)
    key = getattr(args, "key_column", None) or "key"
    declared.setdefault(key, "str")
    return declared
