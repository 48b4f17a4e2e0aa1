"""Tag (multi-valued) columns: declared at import or build with ``--list-column tags``, each
item holding several text values (``red|blue`` in a CSV cell, a list in JSON or Parquet).

The catalog stores an item's tags as one text value, the tags joined by ``|`` (no tag may
hold ``|``), and lists the tag columns in its meta (``list_columns``); a tag column's type is
``str``. Filters read them as sets: ``tags=red`` holds for the items holding red,
``tags=red|blue`` for those holding either, ``tags!=red`` for those without red (items with no
tags included). In the payload index a tag column's text part lists an item's id under each of
its tags (:func:`split_tags`), so a tag's ids are one slice as any value's are, and every
filter on a tag column is a union of value sets (nearsight/index/catalog/filter_types.py:
``typed_conditions``); a bare catalog's column arrays leave tag columns to SQL.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.columns import Column, Part, TextValues

SEPARATOR = "|"
META_KEY = "list_columns"


def tags_of(value: Any, column: str) -> list[str]:
    """A cell's tags: a text cut at ``|``, or a list (JSON, Parquet); blanks dropped, each tag
    once, in order."""
    if value is None:
        return []
    if isinstance(value, str):
        parts: Iterable[Any] = value.split(SEPARATOR)
    elif isinstance(value, list | tuple | np.ndarray):
        parts = list(value)
        for part in parts:
            if isinstance(part, str) and SEPARATOR in part:
                raise NearsightError(f"tag column {column!r}: a tag may not hold '|' ({part!r})")
    else:
        parts = [value]
    tags = [str(part).strip() for part in parts if part is not None and str(part).strip()]
    return list(dict.fromkeys(tags))


def stored_cell(value: Any, column: str) -> str | None:
    """The catalog's text for a cell of tag column ``column`` (None: no tags)."""
    tags = tags_of(value, column)
    return SEPARATOR.join(tags) if tags else None


def listed_tags(meta: Mapping[str, Any], columns: Collection[str]) -> dict[str, Any]:
    """An item's metadata as answers give it: each tag column's stored ``a|b`` as its list of
    tags, ``["a", "b"]``; other columns as stored."""
    return {
        name: value.split(SEPARATOR) if name in columns and isinstance(value, str) else value
        for name, value in meta.items()
    }


def listed_row(row: Mapping[str, Any], catalog_meta: Mapping[str, Any]) -> dict[str, Any]:
    """A catalog row as answers give it (``index show``, ``get_item``, REST's items): its
    ``meta`` with each tag column the catalog's meta records as a list."""
    return {**row, "meta": listed_tags(row.get("meta") or {}, gallery_list_columns(catalog_meta))}


def cell_text(value: Any) -> Any:
    """A value as a CSV cell or a line of text gives it: a list of tags as ``a|b`` (the form
    a CSV's tag cell is read from), anything else as it is."""
    return SEPARATOR.join(map(str, value)) if isinstance(value, list) else value


def gallery_list_columns(meta: Mapping[str, Any]) -> frozenset[str]:
    """The tag columns a gallery's (or catalog's) ``meta`` records."""
    return frozenset(str(column) for column in meta.get(META_KEY) or ())


def check_list_columns(columns: Sequence[str], fields: Iterable[str]) -> list[str]:
    """``--list-column`` names, each a column of the source (``fields``)."""
    known = set(fields)
    for column in columns:
        if column not in known:
            raise NearsightError(f"--list-column {column!r}: the metadata has no such column")
    return list(dict.fromkeys(columns))


def stored_list_columns(conn: sqlite3.Connection) -> list[str]:
    """The tag columns a catalog records (none for a catalog without them)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    except sqlite3.OperationalError:  # no meta table
        return []
    return list(json.loads(row[0])) if row else []


def split_tags(column: Column) -> Column:
    """A tag column's arrays with each item's id under each of its tags (its stored text is
    the tags joined by ``|``); ``has`` stays each id once."""
    part = column.parts.get("text")
    if part is None or part.starts is None or not len(part.ids):
        return column
    stored = part.text().decoded()
    tag_codes: dict[str, int] = {}
    ids, codes = [], []
    starts = np.asarray(part.starts)
    for index, text in enumerate(stored):
        block = np.asarray(part.ids[starts[index] : starts[index + 1]])
        for tag in text.split(SEPARATOR):
            ids.append(block)
            codes.append(np.full(len(block), tag_codes.setdefault(tag, len(tag_codes)), np.int64))
    all_ids = np.concatenate(ids)
    code = np.concatenate(codes)
    encoded = [tag.encode("utf-8", "surrogatepass") for tag in tag_codes]
    order_of = sorted(range(len(encoded)), key=encoded.__getitem__)
    rank = np.empty(len(encoded), np.int64)
    rank[order_of] = np.arange(len(encoded))
    order = np.lexsort((all_ids, rank[code]))
    counts = np.bincount(rank[code], minlength=len(encoded))
    tagged = Part(all_ids[order], TextValues(sorted(encoded)),
                  np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))  # fmt: skip
    return Column({**column.parts, "text": tagged}, np.unique(np.asarray(column.has)))
