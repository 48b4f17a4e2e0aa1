"""The payload index's file: a catalog's filterable columns (nearsight/index/catalog/columns.py's
:class:`Snapshot`) as arrays in one file, memory-mapped when read.

Layout: 8 magic bytes, the length of a JSON manifest (8 bytes, little-endian), the manifest,
then the arrays, each at an offset that is a multiple of :data:`ALIGN`. The manifest names,
per column, the ids that have a value (``has``, sorted) and one part per SQLite storage class
(``integer``, ``real``, ``text``): the item ids ordered by value (ties by id) beside the sorted
values (int64, float64), or for text the distinct values as one UTF-8 buffer with offsets and
where each value's ids begin (``starts``), and each id's position in ``ids`` (``rank``, by id
from the first item's: the test of a condition on a few candidates). A text value's ids are
one slice of ``ids``, sorted; a range of numbers is one slice too, found by two binary searches.

The built-in column ``id`` is not stored: its part is the item ids themselves.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from nearsight.core.atomic import atomic_file
from nearsight.index.catalog.column_read import first_look, ids_of, read_all_ids, read_column
from nearsight.index.catalog.columns import (
    INTEGER_COLUMNS,
    TEXT_COLUMNS,
    Column,
    Part,
    Snapshot,
    TextValues,
)
from nearsight.index.catalog.list_columns import split_tags, stored_list_columns
from nearsight.index.catalog.payload_eval import part_rank

T = TypeVar("T")

MAGIC = b"NSPAYLD1"
VERSION = 1
ALIGN = 64
ID_COLUMN = "id"


class PayloadFileError(Exception):
    """A payload file that cannot be read (damaged, another version): rebuild it."""


def write_payload(path: Path, snapshot: Snapshot) -> None:
    """Write ``snapshot`` to ``path`` (a temporary name, fsync, rename)."""
    arrays: list[np.ndarray] = []
    offset = 0

    def ref(array: np.ndarray) -> list[Any]:
        nonlocal offset
        array = np.ascontiguousarray(array)
        entry = [array.dtype.str, offset, int(array.size)]
        arrays.append(array)
        offset += -(-array.nbytes // ALIGN) * ALIGN
        return entry

    columns: dict[str, Any] = {}
    manifest: dict[str, Any] = {
        "version": VERSION,
        "has_meta_table": snapshot.has_meta_table,
        "all_ids": ref(np.asarray(snapshot.all_ids, np.int64)),
        "columns": columns,
    }
    all_ids = snapshot.all_ids
    low = int(all_ids[0]) if len(all_ids) else 0
    span = int(all_ids[-1]) - low + 1 if len(all_ids) else 0
    for key, column in snapshot.columns.items():
        if key == ID_COLUMN:
            continue
        parts: dict[str, Any] = {}
        for storage, part in column.parts.items():
            entry = {"ids": ref(np.asarray(part.ids, np.int64))}
            if len(part.ids):
                entry["rank"] = ref(part_rank(part, low, span))
            if isinstance(part.values, TextValues):
                entry["buffer"] = ref(np.frombuffer(bytes(part.values.buffer), np.uint8))
                entry["offsets"] = ref(part.values.offsets)
                entry["starts"] = ref(np.asarray(part.starts, np.int64))
            else:
                entry["values"] = ref(np.asarray(part.values))
            parts[storage] = entry
        columns[key] = {"has": ref(np.asarray(column.has, np.int64)), "parts": parts}
    header = json.dumps(manifest).encode("utf-8")
    start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    with atomic_file(path) as handle:
        handle.write(MAGIC + len(header).to_bytes(8, "little") + header)
        handle.write(b"\0" * (start - len(MAGIC) - 8 - len(header)))
        for array in arrays:
            handle.write(array.tobytes())
            handle.write(b"\0" * (-array.nbytes % ALIGN))


def read_payload(path: Path) -> Snapshot:
    """The snapshot stored at ``path``, its arrays mapped from the file (read-only)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(len(MAGIC) + 8)
            if len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] != MAGIC:
                raise PayloadFileError(f"{path.name} is not a payload index")
            length = int.from_bytes(head[len(MAGIC) :], "little")
            manifest = json.loads(handle.read(length).decode("utf-8"))
        if manifest.get("version") != VERSION:
            raise PayloadFileError(f"{path.name} is of another version")
        start = -(-(len(MAGIC) + 8 + length) // ALIGN) * ALIGN
        # a plain ndarray over the map (it keeps the map open): numpy's memmap subclass costs
        # microseconds per indexing, and a filter's binary searches index it
        raw = (
            np.memmap(path, np.uint8, "r").view(np.ndarray)
            if size > start
            else np.zeros(0, np.uint8)
        )
    except (OSError, ValueError, UnicodeError) as error:
        raise PayloadFileError(f"{path.name} cannot be read ({error})") from None

    def array(entry: list[Any]) -> np.ndarray:
        dtype, offset, count = np.dtype(entry[0]), int(entry[1]), int(entry[2])
        begin = start + offset
        end = begin + count * dtype.itemsize
        if end > len(raw) or offset < 0 or count < 0:
            raise PayloadFileError(f"{path.name} is truncated")
        return raw[begin:end].view(dtype) if count else np.zeros(0, dtype)

    try:
        all_ids = array(manifest["all_ids"])
        columns: dict[str, Column] = {}
        for key, entry in manifest["columns"].items():
            parts: dict[str, Part] = {}
            for storage, stored in entry["parts"].items():
                rank = array(stored["rank"]) if "rank" in stored else None
                if "buffer" in stored:
                    text = TextValues.from_arrays(array(stored["buffer"]), array(stored["offsets"]))
                    parts[storage] = Part(array(stored["ids"]), text, array(stored["starts"]), rank)
                else:
                    parts[storage] = Part(array(stored["ids"]), array(stored["values"]), None, rank)
            columns[key] = Column(parts, array(entry["has"]))
    except (KeyError, TypeError, ValueError) as error:
        raise PayloadFileError(f"{path.name} is damaged ({error})") from None
    columns[ID_COLUMN] = id_column(all_ids)
    return Snapshot(all_ids, bool(manifest.get("has_meta_table")), columns)


class _Direct:
    """A reader whose chunks are plain reads of one connection (the caller keeps writers
    away: the gallery's lock)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def chunk(self, read: Callable[[sqlite3.Connection], T]) -> T:
        return read(self.conn)


def read_snapshot(conn: sqlite3.Connection, after: int | None = None) -> Snapshot:
    """Every filterable column of every item (``after``: of the items with a larger id only),
    read on ``conn`` while no writer can change the catalog (the gallery's lock).
    columns.Unreadable for values neither numbers nor text."""
    reader = _Direct(conn)
    has_meta = first_look(conn).has_meta_table
    if after is None:
        all_ids = read_all_ids(reader)
    else:
        all_ids = ids_of(conn.execute("SELECT id FROM items WHERE id > ? ORDER BY id", (after,)))
    keys = [key for key in (*INTEGER_COLUMNS, *TEXT_COLUMNS) if key != ID_COLUMN]
    if has_meta:
        where, params = ("", []) if after is None else ("WHERE item_id > ?", [after])
        keys += [row[0] for row in conn.execute(
            f"SELECT DISTINCT key FROM item_meta {where} ORDER BY key", params)]  # fmt: skip
    columns = {key: read_column(reader, key, all_ids, has_meta, by_ids=after is not None)
               for key in keys}  # fmt: skip
    for key in stored_list_columns(conn):  # a tag column: an id under each of its tags
        if key in columns:
            columns[key] = split_tags(columns[key])
    columns[ID_COLUMN] = id_column(all_ids)
    return Snapshot(all_ids, has_meta, columns)


def id_column(all_ids: np.ndarray) -> Column:
    """The built-in ``id`` column: every item's value is its id."""
    return Column({"integer": Part(all_ids, all_ids)}, all_ids)
