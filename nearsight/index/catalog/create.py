"""Creating a gallery catalog (nearsight/index/catalog/store.py describes its tables)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nearsight.index.catalog.rows import (
    INSERT_ITEM,
    INSERT_ITEM_META,
    ITEM_COLUMNS,
    ITEM_META_INDEX,
    ITEM_META_TABLE,
    META_COLUMNS,
    UPSERT_META,
    item_meta,
    item_meta_values,
    item_row,
    meta_values,
    row_values,
)
from nearsight.index.catalog.sqlite_db import Database
from nearsight.index.errors import GalleryError


def create_catalog(
    db_path: str | os.PathLike[str], items: Iterable[dict[str, Any]], meta: dict[str, object]
) -> None:
    """Create a new catalog at ``db_path`` holding ``items`` and ``meta``.

    An item is a dict with ``path`` and optionally ``id`` (default: its position, 0, 1, ...),
    ``label``, ``class_name``, ``split``, ``sha256``, ``width``, ``height`` and ``meta`` (a
    dict of its extra columns). ``created`` is added to ``meta`` when missing.
    """
    path = Path(db_path)
    if path.exists():
        raise GalleryError(f"cannot create catalog {path}: the file already exists")
    items = list(items)
    rows = [item_row(item, position) for position, item in enumerate(items)]
    extras = [item_meta(item) for item in items]
    meta = dict(meta)
    meta.setdefault("created", datetime.now(UTC).isoformat(timespec="seconds"))
    meta.setdefault("next_id", max((row["id"] for row in rows), default=-1) + 1)
    db = Database(path)
    try:
        with db.conn:
            db.table("items").create(ITEM_COLUMNS, pk="id", not_null={"path"})
            db.table("items").create_index(["label"])
            db.table("meta").create(META_COLUMNS, pk="key", not_null={"value"})
            db.conn.executemany(INSERT_ITEM, [row_values(row) for row in rows])
            db.conn.execute(ITEM_META_TABLE)
            db.conn.execute(ITEM_META_INDEX)
            db.conn.executemany(INSERT_ITEM_META, item_meta_values(rows, extras))
            db.conn.executemany(UPSERT_META, meta_values(meta))
    except sqlite3.IntegrityError as error:
        db.close()
        path.unlink(missing_ok=True)
        raise ValueError(f"cannot create catalog {path}: {error} (duplicate ids?)") from None
    db.close()
