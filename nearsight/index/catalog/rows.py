"""How catalog items and meta become SQLite rows and back: the table columns, the item
metadata table, and the conversions (nearsight/index/catalog/store.py and writes.py run the
queries)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from nearsight.data.meta import typed_meta

ITEM_COLUMNS: dict[str, type] = {
    "id": int,
    "path": str,
    "label": int,
    "class_name": str,
    "split": str,
    "sha256": str,
    "width": int,
    "height": int,
}
META_COLUMNS: dict[str, type] = {"key": str, "value": str}
ITEM_META_TABLE = (
    "CREATE TABLE IF NOT EXISTS item_meta (item_id INTEGER NOT NULL, key TEXT NOT NULL, "
    "value NOT NULL, PRIMARY KEY (item_id, key)) WITHOUT ROWID"
)
ITEM_META_INDEX = "CREATE INDEX IF NOT EXISTS item_meta_key ON item_meta (key, value)"
INSERT_ITEM_META = "INSERT OR REPLACE INTO item_meta (item_id, key, value) VALUES (?, ?, ?)"
INSERT_ITEM = (
    f"INSERT INTO items ({', '.join(ITEM_COLUMNS)}) VALUES ({', '.join('?' * len(ITEM_COLUMNS))})"
)
UPSERT_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)


def item_meta(item: dict[str, Any]) -> dict[str, Any]:
    return typed_meta(item.get("meta") or {})


def item_meta_values(rows: list[dict[str, Any]], extras: list[dict[str, Any]]) -> list[tuple]:
    return [
        (row["id"], key, value)
        for row, extra in zip(rows, extras, strict=True)
        for key, value in extra.items()
    ]


def item_row(item: dict[str, Any], default_id: int) -> dict[str, Any]:
    unknown = set(item) - set(ITEM_COLUMNS) - {"meta"}
    if unknown:
        raise ValueError(f"unknown catalog item fields: {', '.join(sorted(unknown))}")
    if item.get("path") is None:
        raise ValueError("a catalog item needs a 'path'")
    row: dict[str, Any] = {}
    for name, kind in ITEM_COLUMNS.items():
        value = item.get(name, default_id if name == "id" else None)
        if value is not None:
            value = os.fspath(value) if name == "path" else kind(value)
        row[name] = value
    return row


def row_values(row: dict[str, Any]) -> tuple:
    return tuple(row[name] for name in ITEM_COLUMNS)


def meta_values(values: dict[str, object]) -> list[tuple[str, str]]:
    return [(str(key), json.dumps(value, default=_to_json)) for key, value in values.items()]


def _to_json(value: object) -> object:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"catalog meta values must be JSON-serialisable, got {type(value).__name__}")


def decode_meta(text: str) -> Any:  # JSON: whatever was stored
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text  # written by something else: give it back as it is
