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
The version is read inside the read transaction that reads the columns, so no write can fall
between the two, and checked again before every use: a changed catalog is never served from
the arrays of an older one.
"""

from __future__ import annotations

import bisect
import os
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

# the built-in columns of ``items`` by declared type (their SQL affinity)
INTEGER_COLUMNS = ("id", "label", "width", "height")
TEXT_COLUMNS = ("class_name", "split")
STORAGE = ("integer", "real", "text")
BUILD_AFTER_USES = 2  # a column is read into arrays on its 2nd filter of a catalog version
_CHUNK_ROWS = 65_536

Version = tuple[int, int, int, int, bytes]


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
        self.buffer = b"".join(encoded)
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(one) for one in encoded], out=self.offsets[1:])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> bytes:
        return self.buffer[int(self.offsets[index]) : int(self.offsets[index + 1])]


@dataclass(frozen=True)
class Part:
    """The values of one storage class: ``ids`` (int64) ordered by value; ``values`` the
    sorted values (int64, float64), or for text ``values`` the distinct strings and
    ``starts`` where each one's ids begin in ``ids`` (one more entry: len(ids))."""

    ids: np.ndarray
    values: np.ndarray | TextValues
    starts: np.ndarray | None = None


@dataclass
class Column:
    """One filterable column: its parts by storage class, and the ids having any value."""

    parts: dict[str, Part]
    has: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.has = np.sort(
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
        """``base`` (None: a new snapshot) with the columns ``keys``, read in one read
        transaction, and the version of the file they were read from."""
        uri = f"file:{quote(str(self.path.absolute()))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            conn.execute("BEGIN")
            count, low, high = conn.execute(
                "SELECT count(*), min(id), max(id) FROM items"
            ).fetchone()
            version = catalog_version(self.path)  # the read lock is held: no write until COMMIT
            old = base
            if old is None:
                if count and high - low + 1 == count:  # ids low..high, none missing
                    all_ids = np.arange(low, high + 1, dtype=np.int64)
                else:
                    all_ids = _ids(conn.execute("SELECT id FROM items ORDER BY id"))
                has_meta = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'item_meta'"
                ).fetchone() is not None  # fmt: skip
                old = Snapshot(all_ids, has_meta, {})
            columns = dict(old.columns)
            for key in keys:
                columns[key] = _read_column(conn, key, old.all_ids, old.has_meta_table)
            conn.execute("COMMIT")
        finally:
            conn.close()
        return version, Snapshot(old.all_ids, old.has_meta_table, columns)


def _read_column(
    conn: sqlite3.Connection, key: str, all_ids: np.ndarray, has_meta_table: bool
) -> Column:
    if key in INTEGER_COLUMNS or key in TEXT_COLUMNS:
        source, params = f"SELECT id, {key} FROM items WHERE typeof({key}) = ?", []
        order = f"{key}, id"
        others = f"SELECT count(*) FROM items WHERE typeof({key}) = 'blob'"
    elif has_meta_table:
        source = "SELECT item_id, value FROM item_meta WHERE key = ? AND typeof(value) = ?"
        params, order = [key], "value, item_id"
        others = (
            "SELECT count(*) FROM item_meta WHERE key = ? AND typeof(value) IN ('blob', 'null')"
        )
    else:
        return Column({})  # an older catalog: no item has a value for the key
    if conn.execute(others, params).fetchone()[0]:  # none written by nearsight: SQL answers
        raise Unreadable(f"column {key!r} holds values neither numbers nor text")
    parts: dict[str, Part] = {}
    for storage in STORAGE:
        cursor = conn.execute(f"{source} ORDER BY {order}", [*params, storage])
        part = _text_part(cursor) if storage == "text" else _number_part(cursor, storage)
        parts[storage] = _only_items(part, all_ids)
    return Column(parts)


def _ids(cursor: sqlite3.Cursor) -> np.ndarray:
    return np.fromiter(cursor, dtype=[("id", np.int64)])["id"].copy()


def _number_part(cursor: sqlite3.Cursor, storage: str) -> Part:
    kind = np.int64 if storage == "integer" else np.float64
    rows = np.fromiter(cursor, dtype=[("id", np.int64), ("value", kind)])
    return Part(rows["id"].copy(), rows["value"].copy())  # ordered by value, then id


def _text_part(cursor: sqlite3.Cursor) -> Part:
    ids: list[np.ndarray] = []
    encoded: list[bytes] = []
    starts: list[int] = []
    seen, previous = 0, None
    while rows := cursor.fetchmany(_CHUNK_ROWS):
        ids.append(np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows)))
        for offset, (_, value) in enumerate(rows):
            if value != previous:
                encoded.append(value.encode("utf-8", "surrogatepass"))
                starts.append(seen + offset)
                previous = value
        seen += len(rows)
    starts.append(seen)
    joined = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return Part(joined, TextValues(encoded), np.asarray(starts, dtype=np.int64))


def _only_items(part: Part, all_ids: np.ndarray) -> Part:
    """``part`` without values of ids the items table lacks (the filter's answer is items)."""
    if not len(part.ids):
        return part
    keep = contains(all_ids, part.ids)
    if keep.all():
        return part
    if part.starts is None:
        return Part(part.ids[keep], part.values[keep])
    # text: drop the ids, and count each distinct value's remaining ids
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
