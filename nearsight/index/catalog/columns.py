"""The catalog's filterable columns as arrays, read once per catalog version, so that a
filter is a few binary searches and set operations (nearsight/index/catalog/column_filter.py)
instead of an SQL query whose every matching row becomes a Python object.

A column (a metadata key of ``item_meta``, or a built-in column of ``items``) is kept as one
:class:`Part` per SQLite storage class of its values (integer, real, text), each holding the
item ids ordered by value (ties by id) beside the sorted values: ``=`` is a block of that
order, a range a prefix or a suffix of it. Text values are one UTF-8 buffer with offsets
(compared as bytes, SQLite's BINARY collation), so a column of 10M items is a few arrays, not
10M Python objects.

The cache is valid for one version of the catalog file: its device, inode, size, mtime and
SQLite's file change counter (header bytes 24-27, incremented by every committed write in
rollback-journal mode; a catalog in WAL mode, where the counter is not kept, is not cached).
Columns are read in short read transactions (:data:`CHUNK_ROWS` rows: a writer waits for one,
never for a whole column), each reading the version while it holds SQLite's read lock, so no
write can fall between the version and the rows; a read whose chunks saw two versions is
thrown away. The version is checked again before every use: a changed catalog is never
served from the arrays of an older one.
"""

from __future__ import annotations

import bisect
import functools
import operator
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, SupportsIndex, TypeVar
from urllib.parse import quote

import numpy as np

T = TypeVar("T")

# the built-in columns of ``items`` by declared type (their SQL affinity)
INTEGER_COLUMNS = ("id", "label", "width", "height")
TEXT_COLUMNS = ("class_name", "split")
STORAGE = ("integer", "real", "text")
BUILD_AFTER_USES = 2  # a column is read into arrays on its 2nd filter of a catalog version
CHUNK_ROWS = 131_072  # rows per read transaction

Version = tuple[int, int, int, int, bytes]


class ChunkReader(Protocol):
    """What reads a catalog in chunks: each ``read`` runs on a connection in one short read
    transaction (:class:`_Reader`), or plainly on a connection no writer can change (the
    payload file's writer holds the gallery's lock)."""

    def chunk(self, read: Callable[[sqlite3.Connection], T]) -> T: ...


class Unreadable(Exception):
    """A column the arrays would not answer as SQL does: filters on it stay in SQL."""


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


class TextValues:
    """Sorted distinct UTF-8 strings as one buffer and offsets; indexable (bytes) for bisect."""

    def __init__(self, encoded: list[bytes]):
        self.buffer: bytes | np.ndarray = b"".join(encoded)
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(one) for one in encoded], out=self.offsets[1:])

    @classmethod
    def from_arrays(cls, buffer: np.ndarray, offsets: np.ndarray) -> TextValues:
        """Values stored elsewhere (a payload file's mapped uint8 buffer and its offsets)."""
        values = cls([])
        values.buffer, values.offsets = buffer, offsets
        return values

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: SupportsIndex) -> bytes:
        at = operator.index(index)  # an int or a numpy integer
        return bytes(self.buffer[int(self.offsets[at]) : int(self.offsets[at + 1])])

    def decoded(self) -> list[str]:
        """Every value as text, in order."""
        return [self[i].decode("utf-8", "surrogatepass") for i in range(len(self))]


@dataclass(frozen=True)
class Part:
    """The values of one storage class: ``ids`` (int64) ordered by value; ``values`` the
    sorted values (int64, float64), or for text ``values`` the distinct strings and
    ``starts`` where each one's ids begin in ``ids`` (one more entry: len(ids))."""

    ids: np.ndarray
    values: np.ndarray | TextValues
    starts: np.ndarray | None = None
    rank: np.ndarray | None = None  # by id from the snapshot's first: position in ``ids``


@dataclass
class Column:
    """One filterable column: its parts by storage class, and the ids having any value."""

    parts: dict[str, Part]
    has: np.ndarray = None  # type: ignore[assignment]  # sorted; None: found from the parts

    def __post_init__(self) -> None:
        if self.has is None:
            self.has = np.unique(  # a tag column lists an id under each of its tags
                np.concatenate([np.zeros(0, np.int64)] + [p.ids for p in self.parts.values()])
            )


@dataclass(frozen=True)
class Snapshot:
    """The columns read at one catalog version, and every item id (sorted)."""

    all_ids: np.ndarray
    has_meta_table: bool
    columns: dict[str, Column]


class ColumnCache:
    """A catalog's columns read into arrays on demand, dropped when the file changes.

    :meth:`snapshot` gives the columns ``keys`` need, or None (the caller asks SQL): a column
    is read on its ``build_after``-th use within a version (a one-off search, the CLI's, keeps
    the SQL query, cheaper than reading a whole column), by a thread of its own unless
    ``background`` is False, so that no search waits for it (seconds at 10M items); until it
    is read, filters on it go to SQL. A catalog whose version cannot be told (WAL mode) is
    never cached. Thread-safe, under a lock of the cache's own, never the catalog's."""

    def __init__(self, path: Path, build_after: int = BUILD_AFTER_USES, *, background: bool = True):
        self.path = path
        self.build_after = build_after
        self.background = background
        self._lock = threading.Lock()
        self._version: Version | None = None
        self._snapshot: Snapshot | None = None
        self._uses: Counter[str] = Counter()
        self._unreadable: Version | None = None  # a version whose columns could not be read
        self._reader: threading.Thread | None = None

    def snapshot(self, keys: list[str]) -> Snapshot | None:
        version = catalog_version(self.path)
        if version is None:
            return None
        with self._lock:
            if version != self._version:
                self._version, self._snapshot, self._uses = version, None, Counter()
            have = self._snapshot.columns if self._snapshot is not None else {}
            missing = [key for key in keys if key not in have]
            if not missing and self._snapshot is not None:
                return self._snapshot
            self._uses.update(missing)
            due = [key for key in missing if self._uses[key] >= self.build_after]
            if not due or version == self._unreadable or self._reader is not None:
                return None
            if self.background:
                self._reader = threading.Thread(
                    target=self._add, args=(version, due), name="catalog-columns", daemon=True
                )
                self._reader.start()
                return None
        self._add(version, due)
        with self._lock:
            have = self._snapshot.columns if self._snapshot is not None else {}
            return self._snapshot if all(key in have for key in keys) else None

    def wait(self, timeout: float | None = None) -> None:
        """Until a background read (if any) is done."""
        reader = self._reader
        if reader is not None:
            reader.join(timeout)

    def _add(self, version: Version, keys: list[str]) -> None:
        """Read ``keys`` and add them to the snapshot of ``version``, unless the file has
        changed meanwhile (then they are of no use: the next filter starts over)."""
        with self._lock:
            base = self._snapshot if self._version == version else None
        try:
            read_at, snapshot = self._read(keys, base)
        except (sqlite3.Error, UnicodeError, Unreadable):  # e.g. text not UTF-8: SQL it is
            read_at, snapshot = None, None
        with self._lock:
            if snapshot is None:
                self._unreadable = version
            elif read_at == version == self._version and self._snapshot is base:
                self._snapshot = snapshot
            self._reader = None

    def _read(self, keys: list[str], base: Snapshot | None) -> tuple[Version | None, Snapshot]:
        """``base`` (None: a new snapshot) with the columns ``keys``, and the version of the
        file they were read from (None: it changed while they were read)."""
        reader = _Reader(self.path)
        try:
            first = reader.chunk(first_look)  # and the version the read is of
            if base is None:  # ids with gaps: read them in order, by chunks
                ids = first.ids if first.ids is not None else _all_ids(reader)
                base = Snapshot(ids, first.has_meta_table, {})
            columns = dict(base.columns)
            for key in keys:
                columns[key] = _read_column(reader, key, base.all_ids, base.has_meta_table)
        except Changed:
            return None, Snapshot(np.zeros(0, np.int64), False, {})
        finally:
            reader.conn.close()
        return reader.version, Snapshot(base.all_ids, base.has_meta_table, columns)


class Changed(Exception):
    """The catalog file changed between two chunks of a read."""


class _Reader:
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


def _all_ids(reader: ChunkReader) -> np.ndarray:
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
    return _ids(conn.execute(query, (after, CHUNK_ROWS)))


def _fetch_all(conn: sqlite3.Connection, query: str, params: tuple[Any, ...]) -> list[Any]:
    return conn.execute(query, params).fetchall()


def _read_column(
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


def _ids(cursor: sqlite3.Cursor) -> np.ndarray:
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


def contains(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``ids`` are in ``sorted_ids`` (sorted, unique)."""
    if not len(sorted_ids):
        return np.zeros(len(ids), dtype=bool)
    position = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[position] == ids


def text_bounds(part: Part, value: bytes) -> tuple[int, int]:
    """(how many ids have a text value < ``value``, how many <= it), bytewise order."""
    assert part.starts is not None and isinstance(part.values, TextValues)
    low = bisect.bisect_left(part.values, value)
    high = bisect.bisect_right(part.values, value, lo=low)
    return int(part.starts[low]), int(part.starts[high])
