"""Reading a catalog's columns into arrays (nearsight/index/catalog/columns.py).

Columns are read in short read transactions (:data:`CHUNK_ROWS` rows: a writer waits for one,
never for a whole column), each reading the catalog file's version (:func:`catalog_version`)
while it holds SQLite's read lock, so no write can fall between the version and the rows; a
read whose chunks saw two versions raises :class:`Changed` and is thrown away. Numbers are read
by chunks of ids and ordered here; a metadata column's text in value order by chunks of the
(key, value) index.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import numpy as np

from nearsight.index.catalog.columns import (
    INTEGER_COLUMNS,
    STORAGE,
    TEXT_COLUMNS,
    Column,
    Part,
    TextValues,
    Unreadable,
    contains,
)

T = TypeVar("T")

CHUNK_ROWS = 131_072  # rows per read transaction

Version = tuple[int, int, int, int, bytes]


class ChunkReader(Protocol):
    """What reads a catalog in chunks: each ``read`` runs on a connection in one short read
    transaction (:class:`VersionedReader`), or plainly on a connection no writer can change (the
    payload file's writer holds the gallery's lock)."""

    def chunk(self, read: Callable[[sqlite3.Connection], T]) -> T: ...


def catalog_version(path: Path) -> Version | None:
    """What changes whenever the catalog file does; None for a file whose writes may leave it
    unchanged (WAL mode) or that cannot be read."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            header = handle.read(100)
    except OSError:
        return None
    if len(header) < 100 or header[18] == 2 or header[19] == 2:  # WAL: no change counter
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, header[24:28])


class Changed(Exception):
    """The catalog file changed between two chunks of a read."""


class VersionedReader:
    """Reads a catalog in short read transactions (:data:`CHUNK_ROWS` rows each: a writer
    waits for one chunk, never for a whole column at 10M items), all of one version of the
    file: one that sees another raises :class:`Changed`."""

    def __init__(self, path: Path):
        self.path = path
        uri = f"file:{quote(str(path.absolute()))}?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        self.version: Version | None = None

    def chunk(self, read: Callable[[sqlite3.Connection], T]) -> T:
        self.conn.execute("BEGIN")
        try:
            self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the read lock
            now = catalog_version(self.path)  # while it is held, no write can commit
            if now is None or (self.version is not None and now != self.version):
                raise Changed
            self.version = now
            return read(self.conn)
        finally:
            self.conn.execute("COMMIT")


@dataclass(frozen=True)
class FirstLook:
    """What one query tells of a catalog: its item ids when they are low..high with no gap
    (None: they must be read), and whether it has ``item_meta``."""

    ids: np.ndarray | None
    has_meta_table: bool


def first_look(conn: sqlite3.Connection) -> FirstLook:
    count, low, high = conn.execute("SELECT count(*), min(id), max(id) FROM items").fetchone()
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'item_meta'"
    ).fetchone() is not None  # fmt: skip
    if not count:
        return FirstLook(np.zeros(0, np.int64), has_meta)
    whole = high - low + 1 == count
    return FirstLook(np.arange(low, high + 1, dtype=np.int64) if whole else None, has_meta)


def read_all_ids(reader: ChunkReader) -> np.ndarray:
    chunks: list[np.ndarray] = []
    after = -(2**63)
    while True:
        ids = reader.chunk(functools.partial(_ids_after, after=after))
        chunks.append(ids)
        if len(ids) < CHUNK_ROWS:
            return np.concatenate(chunks)
        after = int(ids[-1])


def _ids_after(conn: sqlite3.Connection, after: int) -> np.ndarray:
    """The next :data:`CHUNK_ROWS` item ids above ``after``, in order."""
    query = "SELECT id FROM items WHERE id > ? ORDER BY id LIMIT ?"
    return ids_of(conn.execute(query, (after, CHUNK_ROWS)))


def _fetch_all(conn: sqlite3.Connection, query: str, params: tuple[Any, ...]) -> list[Any]:
    return conn.execute(query, params).fetchall()


def read_column(
    reader: ChunkReader, key: str, all_ids: np.ndarray, has_meta_table: bool, by_ids: bool = False
) -> Column:
    """One column's parts: numbers read by chunks of ids and ordered here; text in value
    order by chunks of the (key, value) index, or for a built-in column (or ``by_ids``: the
    items ``all_ids`` are a few of the catalog's) by chunks of ids."""
    builtin = key in INTEGER_COLUMNS or key in TEXT_COLUMNS
    # by chunks of the primary key: "+key" keeps SQLite off the (key, value) index, which
    # would walk every row of the key for each chunk
    if builtin:
        table, value, params = "items", key, []
        where = f"typeof({key}) = ? AND id >= ? AND id < ?"
        source = f"SELECT id, {key} FROM items WHERE {where}"
    elif has_meta_table:
        table, value, params = "item_meta", "value", [key]
        where = "+key = ? AND typeof(value) = ? AND item_id >= ? AND item_id < ?"
        source = f"SELECT item_id, value FROM item_meta WHERE {where}"
    else:
        return Column({})  # an older catalog: no item has a value for the key
    # none written by nearsight (a NULL built-in is an item without a value): SQL answers
    odd = "'blob'" if builtin else "'blob', 'null'"
    item = "id" if builtin else "item_id"
    count = (f"SELECT count(*) FROM {table} WHERE {'' if builtin else '+key = ? AND '}"
             f"typeof({value}) IN ({odd}) AND {item} >= ? AND {item} < ?")  # fmt: skip
    rows: dict[str, list] = {storage: [] for storage in STORAGE}
    bounds = [*all_ids[::CHUNK_ROWS].tolist(), int(all_ids[-1]) + 1] if len(all_ids) else []
    for low, high in zip(bounds, bounds[1:], strict=False):

        def read(conn: sqlite3.Connection, low: int = low, high: int = high) -> None:
            if conn.execute(count, [*params, low, high]).fetchone()[0]:
                raise Unreadable(f"column {key!r} holds values neither numbers nor text")
            for storage in ("integer", "real"):
                kind = np.int64 if storage == "integer" else np.float64
                rows[storage].append(np.fromiter(conn.execute(
                    source, [*params, storage, low, high]),
                    dtype=[("id", np.int64), ("value", kind)]))  # fmt: skip
            if builtin or by_ids:
                rows["text"].extend(conn.execute(source, [*params, "text", low, high]))

        reader.chunk(read)
    parts = {"integer": _number_part(rows["integer"], np.int64),
             "real": _number_part(rows["real"], np.float64)}  # fmt: skip
    by_value = not builtin and not by_ids
    parts["text"] = _indexed_text(reader, key) if by_value else _coded_text(rows["text"])
    return Column({storage: _only_items(part, all_ids) for storage, part in parts.items()})


def ids_of(cursor: sqlite3.Cursor) -> np.ndarray:
    return np.fromiter(cursor, dtype=[("id", np.int64)])["id"].copy()


def _number_part(chunks: list[np.ndarray], kind: type) -> Part:
    rows = np.concatenate(chunks) if chunks else np.zeros(0, [("id", np.int64), ("value", kind)])
    order = np.lexsort((rows["id"], rows["value"]))  # by value, then id
    return Part(rows["id"][order], rows["value"][order])


def _indexed_text(reader: ChunkReader, key: str) -> Part:
    """A metadata column's text values, read in the (key, value) index's order by chunks."""
    ids: list[np.ndarray] = []
    encoded: list[bytes] = []
    starts: list[int] = []
    seen, last, previous = 0, None, None
    select = "SELECT item_id, value FROM item_meta WHERE key = ? AND typeof(value) = 'text'"
    while True:
        params: tuple[Any, ...]
        if last is None:
            query, params = f"{select} ORDER BY value, item_id LIMIT ?", (key, CHUNK_ROWS)
        else:
            query = f"{select} AND (value, item_id) > (?, ?) ORDER BY value, item_id LIMIT ?"
            params = (key, last[1], last[0], CHUNK_ROWS)
        rows = reader.chunk(functools.partial(_fetch_all, query=query, params=params))
        ids.append(np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows)))
        for offset, (_, value) in enumerate(rows):
            if previous is None or value != previous:  # the next distinct value
                encoded.append(value.encode("utf-8", "surrogatepass"))
                starts.append(seen + offset)
                previous = value
        last = rows[-1] if rows else last
        seen += len(rows)
        if len(rows) < CHUNK_ROWS:
            break
    starts.append(seen)
    return Part(np.concatenate(ids), TextValues(encoded), np.asarray(starts, dtype=np.int64))


def _coded_text(rows: list[tuple[int, str]]) -> Part:
    """A built-in column's text values (few distinct: class names, splits) put in order."""
    codes: dict[str, int] = {}
    code = np.fromiter((codes.setdefault(value, len(codes)) for _, value in rows), np.int64,
                       count=len(rows))  # fmt: skip
    ids = np.fromiter((item for item, _ in rows), np.int64, count=len(rows))
    encoded = [value.encode("utf-8", "surrogatepass") for value in codes]
    rank = np.empty(len(encoded), np.int64)
    rank[sorted(range(len(encoded)), key=encoded.__getitem__)] = np.arange(len(encoded))
    order = np.lexsort((ids, rank[code]))
    starts = np.concatenate([[0], np.cumsum(np.bincount(rank[code], minlength=len(encoded)))])
    return Part(ids[order], TextValues(sorted(encoded)), starts.astype(np.int64))


def _only_items(part: Part, all_ids: np.ndarray) -> Part:
    """``part`` without values of ids the items table lacks (the filter's answer is items)."""
    if not len(part.ids):
        return part
    keep = contains(all_ids, part.ids)
    if keep.all():
        return part
    if isinstance(part.values, np.ndarray):
        return Part(part.ids[keep], part.values[keep])
    # text: drop the ids, and count each distinct value's remaining ids
    assert part.starts is not None  # a text part has its starts
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    return Part(part.ids[keep], part.values, kept_before[part.starts])
