"""The gallery catalog: one SQLite database (through sqlite-utils) per gallery folder.

``catalog.db`` holds two tables:

- ``items``: one row per indexed image. ``id`` is the image's FAISS id; ``path``, ``label``
  (NULL when unlabelled), ``class_name``, ``split``, ``sha256`` (of the file's bytes),
  ``width`` and ``height``.
- ``item_meta`` (absent in catalogs made before metadata existed): ``item_id``, ``key``,
  ``value``, one row per item and extra column (a CSV column beyond ``path,label,split``,
  ``index add --meta KEY=VALUE``). ``value`` has no declared type, so SQLite keeps each value
  an integer, a real or text as given (typed by their column: nearsight/data/meta.py) and
  :meth:`Catalog.filter_ids` compares numbers as numbers.
- ``meta``: ``key`` -> ``value`` where the value is JSON text (so ``dim`` comes back as an int):
  ``model_sha256``, ``dim``, ``metric``, ``index_type``, ``created`` and any extras; ``next_id``
  is kept by :meth:`Catalog.add_items` so that a removed id is never given to a new image.

Creating one: nearsight/index/catalog/create.py; the SQL of its writes:
nearsight/index/catalog/writes.py. The gallery folder around it (written whole, its catalog
opened): nearsight/index/gallery/files.py.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from nearsight.data.meta import MetaValue
from nearsight.index.catalog.column_cache import ColumnCache
from nearsight.index.catalog.column_filter import evaluate, supported
from nearsight.index.catalog.columns import Snapshot
from nearsight.index.catalog.filter_notes import value_notes
from nearsight.index.catalog.filter_sql import budget, run_filter
from nearsight.index.catalog.filter_types import typed_conditions
from nearsight.index.catalog.filters import Condition
from nearsight.index.catalog.payload_file import read_snapshot
from nearsight.index.catalog.rows import (
    ITEM_COLUMNS,
    META_COLUMNS,
    UPSERT_META,
    decode_meta,
    meta_values,
)
from nearsight.index.catalog.sqlite_db import Database
from nearsight.index.catalog.writes import delete_items, in_chunks, insert_items, next_id
from nearsight.index.errors import GalleryError

CATALOG_FILE = "catalog.db"
_SQLITE_HEADER = b"SQLite format 3\x00"
FILTER_TIME_LIMIT_S = 2.0  # one filter query; past it the search is refused


class Catalog:
    """An open catalog; use :meth:`open` (or :func:`nearsight.index.gallery.files.open_catalog_dir`),
    ideally in a ``with``."""

    def __init__(self, db: Database, path: Path):
        self._db = db
        self.path = path
        self._lock = threading.RLock()
        # read once per open catalog; this object's own writes reset them
        self._meta_keys: list[str] | None = None
        self._column_types: dict[str, str] | None = None
        self._class_names: dict[int, str] | None = None
        # what a filter reads before its query (tag columns, the item_meta table): once per
        # open catalog and write through it, so a warm filter never waits for the lock
        self._filter_schema: tuple[list[str], bool] | None = None
        self._columns = ColumnCache(path)  # filters' columns, per version of the file

    @classmethod
    def open(cls, db_path: str | os.PathLike[str], *, readonly: bool = False) -> Catalog:
        """Open and check a catalog: a SQLite file with both tables and all their columns."""
        path = Path(db_path)
        if not path.is_file():
            raise GalleryError(f"no gallery catalog at {path}")
        with open(path, "rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
        if header and header != _SQLITE_HEADER:
            raise GalleryError(f"{path} is not a SQLite database (damaged, or not a catalog)")
        try:
            if readonly:
                uri = f"file:{quote(str(path.absolute()))}?mode=ro"
                conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            else:
                conn = sqlite3.connect(path, check_same_thread=False)
        except sqlite3.Error as error:
            raise GalleryError(f"cannot open gallery catalog {path}: {error}") from None
        catalog = cls(Database(conn), path)
        try:
            catalog._check()
        except BaseException:
            catalog.close()
            raise
        return catalog

    def _check(self) -> None:
        with self._guard():
            tables = set(self._db.table_names())
            for table, columns in (("items", ITEM_COLUMNS), ("meta", META_COLUMNS)):
                if table not in tables:
                    raise GalleryError(
                        f"{self.path} is not a nearsight catalog: no '{table}' table"
                    )
                present = {column.name for column in self._db[table].columns}
                missing = [name for name in columns if name not in present]
                if missing:
                    raise GalleryError(
                        f"{self.path} is not a nearsight catalog: table '{table}' has no "
                        f"'{missing[0]}' column"
                    )
            self.count()  # walks a b-tree of items: most truncated files fail here

    # -- reading ----------------------------------------------------------------------------

    def count(self) -> int:
        with self._guard():
            return int(self._db.execute("SELECT count(*) FROM items").fetchone()[0])

    def meta(self) -> dict[str, Any]:
        with self._guard():
            rows = self._db.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
        return {key: decode_meta(value) for key, value in rows}

    def items(self, ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """All items, or those with ``ids`` (unknown ids are skipped), ordered by id. Each row
        has the item columns and ``meta``, a dict of its extra columns (maybe empty)."""
        select = f"SELECT {', '.join(ITEM_COLUMNS)} FROM items"
        with self._guard():
            if ids is None:
                cursor = self._db.execute(f"{select} ORDER BY id")
                rows = [dict(zip(ITEM_COLUMNS, row, strict=True)) for row in cursor]
                extras = self._item_meta(None)
            else:
                wanted = sorted({int(i) for i in ids})
                rows = []
                for chunk, marks in in_chunks(wanted):
                    cursor = self._db.execute(f"{select} WHERE id IN ({marks}) ORDER BY id", chunk)
                    rows.extend(dict(zip(ITEM_COLUMNS, row, strict=True)) for row in cursor)
                extras = self._item_meta(wanted)
        for row in rows:
            row["meta"] = extras.get(row["id"], {})
        return rows

    def has_item_meta(self) -> bool:
        """Whether the catalog has the ``item_meta`` table (catalogs made before it do not)."""
        with self._guard():
            found = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'item_meta'"
            ).fetchone()
        return found is not None

    def _item_meta(self, ids: list[int] | None) -> dict[int, dict[str, Any]]:
        if not self.has_item_meta():
            return {}
        select = "SELECT item_id, key, value FROM item_meta"
        rows: list[tuple] = []
        if ids is None:
            rows = self._db.execute(f"{select} ORDER BY item_id, key").fetchall()
        else:
            for chunk, marks in in_chunks(ids):
                rows += self._db.execute(
                    f"{select} WHERE item_id IN ({marks}) ORDER BY item_id, key", chunk
                ).fetchall()
        extras: dict[int, dict[str, Any]] = {}
        for item_id, key, value in rows:
            extras.setdefault(int(item_id), {})[key] = value
        return extras

    def meta_keys(self) -> list[str]:
        """The extra column names items have, sorted (read once per open catalog: a write
        makes a new Catalog object)."""
        if self._meta_keys is None:
            if not self.has_item_meta():
                return []
            with self._guard():
                rows = self._db.execute(
                    "SELECT DISTINCT key FROM item_meta ORDER BY key"
                ).fetchall()
            self._meta_keys = [row[0] for row in rows]
        return list(self._meta_keys)

    def filter_ids(
        self, conditions: Sequence[Condition], *, time_limit_s: float = FILTER_TIME_LIMIT_S
    ) -> np.ndarray:
        """Sorted int64 ids of the items meeting every condition, each value read as its
        column's type (nearsight.index.catalog.filter_types.typed_conditions).

        The query runs on a connection of its own, read-only and outside the catalog's lock, so
        a slow filter never makes other searches of the gallery wait; past ``time_limit_s`` it
        is stopped with a FilterError.

        From a column's second filter on (per version of the catalog file) the columns are
        read into arrays once and the filter is evaluated on them
        (nearsight/index/catalog/column_filter.py), with the SQL query's answer."""
        if self._filter_schema is None:
            self._filter_schema = (self.list_columns(), self.has_item_meta())
        tags, has_item_meta = self._filter_schema
        typed = typed_conditions(conditions, self.column_types(), self.class_names(), tags)
        # the column arrays list an id once per value: a tag column's filters stay in SQL
        if supported(typed) and not any(c.key in tags for c in typed):
            snapshot = self._columns.snapshot(list(dict.fromkeys(c.key for c in typed)))
            if snapshot is not None:  # reading the columns is the catalog's, not the budget's
                return evaluate(typed, snapshot, budget(time_limit_s)[1])
        return run_filter(self.path, typed, has_item_meta, time_limit_s, tags)

    def payload_snapshot(self, after: int | None = None) -> Snapshot:
        """Every filterable column as arrays (``after``: of the items after that id only),
        for the payload index (nearsight/index/catalog/payload_file.py)."""
        with self._guard():
            return read_snapshot(self._db.conn, after)

    def filter_notes(self, conditions: Sequence[Condition]) -> list[str]:
        """Notes on text values no item holds, naming the closest ones held
        (nearsight/index/catalog/filter_notes.py)."""
        if not self.has_item_meta():
            return []
        types = self.column_types()
        tags = self.list_columns()
        typed = typed_conditions(conditions, types, self.class_names(), tags)
        with self._guard():
            return value_notes(self._db.conn, typed, types, tags)

    def list_columns(self) -> list[str]:
        """The tag (multi-valued) columns (nearsight/index/catalog/list_columns.py)."""
        return [str(column) for column in self.meta().get("list_columns") or []]

    def column_types(self) -> dict[str, str]:
        """The metadata columns' types (``int``, ``float``, ``str``): as the gallery stores them
        (catalog meta ``meta_types``), else as their stored values are (an older catalog);
        read once per open catalog."""
        if self._column_types is None:
            declared = dict(self.meta().get("meta_types") or {})
            untyped = [key for key in self.meta_keys() if key not in declared]
            found: dict[str, str] = {}
            if untyped:
                marks = ",".join("?" * len(untyped))
                with self._guard():
                    rows = self._db.execute(
                        "SELECT key, group_concat(DISTINCT typeof(value)) FROM item_meta "
                        f"WHERE key IN ({marks}) GROUP BY key", untyped,
                    ).fetchall()  # fmt: skip
                for key, kinds in rows:
                    text, real = "text" in kinds, "real" in kinds
                    found[key] = "str" if text else "float" if real else "int"
            self._column_types = {**declared, **found}
        return dict(self._column_types)

    def ids_by_meta(self, key: str, values: Sequence[MetaValue]) -> dict[MetaValue, list[int]]:
        """value -> ids of the items whose metadata ``key`` has that value (the item_meta
        (key, value) index: one look-up per value)."""
        found: dict[MetaValue, list[int]] = {}
        if not self.has_item_meta() or not values:
            return found
        with self._guard():
            for chunk, marks in in_chunks(values):
                rows = self._db.execute(
                    f"SELECT value, item_id FROM item_meta WHERE key = ? AND value IN ({marks})",
                    [key, *chunk],
                ).fetchall()
                for value, item_id in rows:
                    found.setdefault(value, []).append(int(item_id))
        return found

    def ids_by_sha256(self, hashes: Sequence[str]) -> dict[str, int]:
        """sha256 -> the id of an item with a file of those bytes (the first), for ``hashes``."""
        wanted = sorted(set(hashes))
        found: dict[str, int] = {}
        with self._guard():
            for chunk, marks in in_chunks(wanted):
                rows = self._db.execute(
                    f"SELECT sha256, min(id) FROM items WHERE sha256 IN ({marks}) GROUP BY sha256",
                    chunk,
                ).fetchall()
                found.update((sha, int(item_id)) for sha, item_id in rows)
        return found

    def class_names(self) -> dict[int, str]:
        """label -> class name, for the labels that have one (the first name of a label);
        read once per open catalog, as every filtered search asks."""
        if self._class_names is None:
            with self._guard():
                rows = self._db.execute(
                    "SELECT label, min(class_name) FROM items WHERE label IS NOT NULL "
                    "AND class_name IS NOT NULL GROUP BY label ORDER BY label"
                ).fetchall()
            self._class_names = {int(label): str(name) for label, name in rows}
        return dict(self._class_names)

    def get(self, item_id: int) -> dict[str, Any] | None:
        found = self.items([item_id])
        return found[0] if found else None

    def labels(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, labels) as int64 arrays ordered by id; an unlabelled item has label -1."""
        with self._guard():
            rows = self._db.execute("SELECT id, label FROM items ORDER BY id").fetchall()
        ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
        labels = np.fromiter(
            (-1 if row[1] is None else row[1] for row in rows), dtype=np.int64, count=len(rows)
        )
        return ids, labels

    # -- writing (each call is one transaction) ----------------------------------------------

    def set_meta(self, **values: object) -> None:
        self._column_types = self._filter_schema = None  # meta_types may change
        with self._guard(writing=True), self._db.conn:
            self._db.conn.executemany(UPSERT_META, meta_values(values))

    def next_id(self) -> int:
        """The id the next added item gets: after every id the catalog has ever held."""
        with self._guard():
            return next_id(self._db.conn)

    def add_items(
        self, items: Iterable[dict[str, Any]], *, meta: dict[str, object] | None = None
    ) -> list[int]:
        """Insert ``items`` (without ids) and return the ids given to them: after every id the
        catalog has ever held, so ids of removed items are not reused. ``meta`` is updated in
        the same transaction."""
        self._meta_keys = self._column_types = self._class_names = self._filter_schema = None
        new = list(items)
        with self._guard(writing=True), self._db.conn:
            return insert_items(self._db.conn, new, meta)

    def remove(self, ids: Iterable[int], *, meta: dict[str, object] | None = None) -> None:
        """Delete the items with ``ids``; all of them must exist (else nothing is deleted).
        ``meta`` is updated in the same transaction."""
        self._meta_keys = self._column_types = self._class_names = self._filter_schema = None
        wanted = sorted({int(i) for i in ids})
        with self._guard(writing=True), self._db.conn:
            delete_items(self._db.conn, self.path, wanted, meta, self.has_item_meta())

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _guard(self, *, writing: bool = False) -> Iterator[None]:
        """One caller at a time (a served gallery is searched from several threads); SQLite
        errors from the file (damaged, read-only) become a one-line :class:`GalleryError`."""
        with self._lock:
            try:
                yield
            except sqlite3.ProgrammingError:
                raise  # misuse (a closed catalog): a bug, keep the traceback
            except sqlite3.DatabaseError as error:
                unwritable = "readonly" in str(error) or (
                    writing and isinstance(error, sqlite3.OperationalError)
                )  # a full disk, a quota: SQLite says "disk I/O error" or "disk is full"
                problem = "cannot be written" if unwritable else "is damaged"
                raise GalleryError(f"gallery catalog {self.path} {problem}: {error}") from None
