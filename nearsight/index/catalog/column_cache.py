"""A catalog's columns read into arrays on demand and kept while the catalog file is
unchanged.

The cache is valid for one version of the catalog file: its device, inode, size, mtime and
SQLite's file change counter (header bytes 24-27, incremented by every committed write in
rollback-journal mode; a catalog in WAL mode, where the counter is not kept, is not cached).
A read whose chunks saw two versions is thrown away (nearsight/index/catalog/column_read.py).
The version is checked again before every use: a changed catalog is never served from the
arrays of an older one.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from pathlib import Path

import numpy as np

from nearsight.index.catalog.column_read import (
    Changed,
    Version,
    VersionedReader,
    catalog_version,
    first_look,
    read_all_ids,
    read_column,
)
from nearsight.index.catalog.columns import Snapshot, Unreadable

BUILD_AFTER_USES = 2  # a column is read into arrays on its 2nd filter of a catalog version


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
        reader = VersionedReader(self.path)
        try:
            first = reader.chunk(first_look)  # and the version the read is of
            if base is None:  # ids with gaps: read them in order, by chunks
                ids = first.ids if first.ids is not None else read_all_ids(reader)
                base = Snapshot(ids, first.has_meta_table, {})
            columns = dict(base.columns)
            for key in keys:
                columns[key] = read_column(reader, key, base.all_ids, base.has_meta_table)
        except Changed:
            return None, Snapshot(np.zeros(0, np.int64), False, {})
        finally:
            reader.conn.close()
        return reader.version, Snapshot(base.all_ids, base.has_meta_table, columns)
