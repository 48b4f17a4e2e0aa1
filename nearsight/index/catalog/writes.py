"""The catalog's writes as SQL on one connection, inside the caller's transaction
(nearsight/index/catalog/store.py holds the lock, opens the transaction and forgets what it
had read), and the id lists every query by ids is cut into."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from nearsight.index.catalog.rows import (
    INSERT_ITEM,
    INSERT_ITEM_META,
    ITEM_META_INDEX,
    ITEM_META_TABLE,
    UPSERT_META,
    decode_meta,
    item_meta,
    item_meta_values,
    item_row,
    meta_values,
    row_values,
)
from nearsight.index.errors import GalleryError

CHUNK = 500  # values per "IN (...)" query, well under SQLite's variable limit

Value = TypeVar("Value")


def in_chunks(values: Sequence[Value]) -> Iterator[tuple[list[Value], str]]:
    """``values`` by :data:`CHUNK`, each with its ``?, ?, ...`` marks for ``IN (...)``."""
    for start in range(0, len(values), CHUNK):
        chunk = list(values[start : start + CHUNK])
        yield chunk, ",".join("?" * len(chunk))


def next_id(conn: sqlite3.Connection) -> int:
    """The id the next added item gets: after every id the catalog has ever held (``meta``'s
    ``next_id`` remembers removed ones)."""
    highest = conn.execute("SELECT max(id) FROM items").fetchone()[0]
    stored_next = conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
    start = 0 if highest is None else int(highest) + 1
    if stored_next is not None:
        start = max(start, int(decode_meta(stored_next[0])))
    return start


def insert_items(
    conn: sqlite3.Connection, items: list[dict[str, Any]], meta: dict[str, object] | None
) -> list[int]:
    """Insert ``items`` (without ids) after :func:`next_id`, their metadata (an old catalog
    gets the ``item_meta`` table with its first), and ``meta``; the ids given."""
    for item in items:
        if "id" in item:
            raise ValueError("add_items assigns ids itself; remove 'id' from the items")
    start = next_id(conn)
    rows = [item_row(item, start + offset) for offset, item in enumerate(items)]
    conn.executemany(INSERT_ITEM, [row_values(row) for row in rows])
    extras = [item_meta(item) for item in items]
    if any(extras):
        conn.execute(ITEM_META_TABLE)
        conn.execute(ITEM_META_INDEX)
        conn.executemany(INSERT_ITEM_META, item_meta_values(rows, extras))
    updates = {**(meta or {}), "next_id": start + len(rows)}
    conn.executemany(UPSERT_META, meta_values(updates))
    return [row["id"] for row in rows]


def delete_items(
    conn: sqlite3.Connection,
    path: Path,
    ids: list[int],
    meta: dict[str, object] | None,
    has_item_meta: bool,
) -> None:
    """Delete the items ``ids`` (sorted, distinct) and their metadata, and update ``meta``;
    a GalleryError naming the missing ones when any is not there (then nothing changes)."""
    present: set[int] = set()
    for chunk, marks in in_chunks(ids):
        found = conn.execute(f"SELECT id FROM items WHERE id IN ({marks})", chunk)
        present.update(int(row[0]) for row in found)
    missing = [i for i in ids if i not in present]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise GalleryError(f"gallery catalog {path} has no item with id {shown}")
    for chunk, marks in in_chunks(ids):
        conn.execute(f"DELETE FROM items WHERE id IN ({marks})", chunk)
        if has_item_meta:
            conn.execute(f"DELETE FROM item_meta WHERE item_id IN ({marks})", chunk)
    if meta:
        conn.executemany(UPSERT_META, meta_values(meta))
