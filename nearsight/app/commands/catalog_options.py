"""The options of ``index build``, ``import`` and ``add`` that shape the gallery's catalog and
files: column types, keys, the embeddings copy and the neighbour graph."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence


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
    parser.add_argument(
        "--list-column",
        action="append",
        metavar="NAME",
        help="a tag column: each item holds several values ('red|blue' in a CSV cell, a list "
        "in Parquet); filters test each item's set (tags=red, tags=red|blue, tags!=red); "
        "repeatable",
    )
    parser.add_argument(
        "--group-column",
        metavar="NAME",
        help="the metadata column that groups items (a product's SKU when a product has several "
        "photos): recorded as the gallery's default for grouped searches (search --group-by)",
    )


def declared_types(args: argparse.Namespace) -> dict[str, str]:
    """``--meta-types``, with the key column declared text (keys are names, not numbers)."""
    from nearsight.data.meta import parse_meta_types
    from nearsight.index.gallery.keys import declared_meta_types

    declared = declared_meta_types(parse_meta_types(args.meta_types),
                                   getattr(args, "key_column", None))  # fmt: skip
    for column in (
        getattr(args, "list_column", None) or []
    ):  # tags are text, whatever they look like
        declared[column] = "str"
    return declared


def add_embeddings_option(parser: argparse.ArgumentParser) -> None:
    """``--embeddings auto|keep|drop``, the catalog options and ``--neighbour-graph`` of
    ``index build`` and ``index import``."""
    parser.add_argument(
        "--embeddings",
        default="auto",
        choices=["auto", "keep", "drop"],
        help="write embeddings.npy, a second copy of the vectors (keep), or not (drop); auto "
        "(default) drops it when the vectors exceed --max-index-memory and exact vectors remain "
        "without it (a flat, ivf or hnsw index; the imported files or kept build chunks for "
        "ivfpq/opq). Without it, eval and search by id read the vectors back from those",
    )
    add_catalog_options(parser)
    parser.add_argument(
        "--neighbour-graph",
        action="store_true",
        help="also store each item's 16 nearest items, so that database-side augmentation "
        "(--rerank dba, dba+aqe) looks them up instead of searching the index per candidate",
    )


def check_group_column(
    column: str | None, fields: list[dict], list_columns: Sequence[str] | None = None
) -> None:
    """A one-line error, before any embedding, when ``--group-column`` names a column the
    source's rows do not have, or a tag column (``--list-column``)."""
    from nearsight.core.errors import NearsightError, closest_names
    from nearsight.search.groups import ROW_COLUMNS

    if column is None:
        return
    columns = {key for row in fields for key in (row.get("meta") or {})} | set(ROW_COLUMNS)
    if column not in columns:
        hint = closest_names(column, columns)
        raise NearsightError(f"--group-column {column}: the source has no such column; {hint}")
    if column in (list_columns or ()):
        raise NearsightError(
            f"--group-column {column}: a tag column (--list-column), whose items each hold "
            "several values; group by a column of one value an item (a product id)"
        )


def record_group_column(column: str | None, out: str | os.PathLike[str]) -> None:
    """``--group-column``, recorded in the new gallery's catalog meta (one key)."""
    if column is None:
        return
    from nearsight.index.gallery.change import set_meta
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.groups import GROUP_COLUMN_META

    with Gallery.open(out) as gallery:
        set_meta(gallery, **{GROUP_COLUMN_META: column})
