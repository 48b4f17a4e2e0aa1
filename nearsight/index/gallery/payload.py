"""The payload index of a gallery folder, ``payload.idx`` (nearsight/index/catalog/payload_file.py:
the filterable columns as sorted arrays; payload_index.py: filters as set operations on them).

It is written with the folder: by the build and by ``compact``, into the temporary folder
before the rename (:func:`write_payload_into`). ``add`` and ``remove`` write no payload: the
catalog transaction is their commit point, as for the vectors; when the gallery opens, the
items added since the file was written (ids after its last) are read from the catalog, and the
removed ids (catalog meta ``removed``) are taken out of its answers. A gallery written before
the index, or whose file is missing or does not match its catalog, gets the file built from
its catalog on open, and written when the folder may be written (else it is kept in memory).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nearsight.index.catalog.column_filter import supported
from nearsight.index.catalog.columns import Snapshot, Unreadable, contains
from nearsight.index.catalog.filter_sql import budget
from nearsight.index.catalog.filter_types import typed_conditions
from nearsight.index.catalog.filters import FILTERABLE_BUILTINS, Condition
from nearsight.index.catalog.payload_file import PayloadFileError, read_payload, write_payload
from nearsight.index.catalog.payload_index import PayloadIndex
from nearsight.index.catalog.store import CATALOG_FILE, FILTER_TIME_LIMIT_S, Catalog
from nearsight.index.errors import GalleryError

PAYLOAD_FILE = "payload.idx"
NAMED_KEYS = ("label", "class_name")  # the filters that read the class names


def write_payload_into(folder: Path) -> None:
    """Write the payload index of the catalog in ``folder`` (a gallery being written)."""
    with Catalog.open(folder / CATALOG_FILE) as catalog:
        snapshot = _snapshot(catalog)
    if snapshot is not None:
        write_payload(folder / PAYLOAD_FILE, snapshot)


def open_payload(
    folder: Path, catalog: Catalog, ids: np.ndarray, removed: np.ndarray
) -> PayloadIndex | None:
    """The gallery's payload index as of its catalog (``ids``: its item ids, sorted;
    ``removed``: ids removed since the last compaction), built and saved when missing or
    stale; None for a catalog whose values the arrays cannot hold (filters stay in SQL)."""
    path = folder / PAYLOAD_FILE
    base: Snapshot | None = None
    with contextlib.suppress(PayloadFileError, FileNotFoundError):
        base = read_payload(path)
    # a catalog changed by hand (an item_meta table dropped, as before metadata) is rebuilt
    fits = base is not None and base.has_meta_table == catalog.has_item_meta()
    if base is not None and fits and _covers(base.all_ids, ids, removed):
        last = int(base.all_ids[-1]) if len(base.all_ids) else -1
        added = None
        if len(ids) and int(ids[-1]) > last:
            added = _snapshot(catalog, last)
            if added is None:
                return None
        return PayloadIndex(base, added, removed)
    base = _snapshot(catalog)
    if base is None:
        return None
    with contextlib.suppress(OSError):  # a folder this process may not write: in memory
        write_payload(path, base)
    return PayloadIndex(base, None, removed)


def _snapshot(catalog: Catalog, after: int | None = None) -> Snapshot | None:
    try:
        return catalog.payload_snapshot(after)
    except (Unreadable, UnicodeError, sqlite3.Error):
        return None


def _covers(base_ids: np.ndarray, ids: np.ndarray, removed: np.ndarray) -> bool:
    """Whether the file's items are the catalog's up to its last id, bar the removed ones."""
    if not len(base_ids):
        return not len(ids)
    upto = ids[: int(np.searchsorted(ids, base_ids[-1], side="right"))]
    if not contains(base_ids, upto).all():
        return False
    gone = int(contains(base_ids, removed).sum()) if len(removed) else 0
    return len(base_ids) == len(upto) + gone


def filter_ids(
    payload: PayloadIndex | None,
    catalog: Catalog,
    conditions: Sequence[Condition],
    column_types: dict[str, str],
    time_limit_s: float = FILTER_TIME_LIMIT_S,
) -> np.ndarray:
    """Sorted ids of the items meeting every condition: from the payload index, or (none, or
    a condition the arrays do not answer as SQL would) from the catalog."""
    names = catalog.class_names() if any(c.key in NAMED_KEYS for c in conditions) else {}
    typed = typed_conditions(conditions, column_types, names, catalog.list_columns())
    if payload is None or not supported(typed):
        return catalog.filter_ids(conditions, time_limit_s=time_limit_s)
    return payload.filter_ids(typed, budget(time_limit_s)[1])


def filter_notes(
    payload: PayloadIndex | None,
    catalog: Catalog,
    conditions: Sequence[Condition],
    column_types: dict[str, str],
) -> list[str]:
    """Notes on text values no item holds (nearsight/index/catalog/filter_notes.py)."""
    if payload is None:
        return catalog.filter_notes(conditions)
    if not any(c.key not in FILTERABLE_BUILTINS for c in conditions):
        return []
    names = catalog.class_names() if any(c.key in NAMED_KEYS for c in conditions) else {}
    typed = typed_conditions(conditions, column_types, names, catalog.list_columns())
    return payload.notes(typed, column_types)


def column_types(payload: PayloadIndex | None, catalog: Catalog, meta: dict) -> dict[str, str]:
    """Each metadata column's type: as the gallery declares it (meta ``meta_types``), else as
    its stored values are (from the payload index: no scan of the catalog)."""
    if payload is None:
        return catalog.column_types()
    declared = dict(meta.get("meta_types") or {})
    found = {key: kind for key, kind in payload.column_types().items() if key not in declared}
    return {**declared, **found}


def facets(
    payload: PayloadIndex | None,
    folder: Path,
    meta_keys: Sequence[str],
    typed_columns: Sequence[str],
    allowed: np.ndarray | None,
    keys: Sequence[str] | None,
) -> dict[str, dict[object, int]]:
    """Per column, each value's count among the ``allowed`` items (None: all) of the gallery
    in ``folder`` (``meta_keys``: its metadata columns; ``typed_columns``: those with a type)
    from its payload index (PayloadIndex.facets); GalleryError for an unknown column or
    without a payload index."""
    wanted = list(meta_keys if keys is None else keys)
    known = {*typed_columns, *FILTERABLE_BUILTINS}
    unknown = [key for key in wanted if key not in known]
    if unknown:
        raise GalleryError(f"gallery {folder} has no column {unknown[0]!r}")
    if payload is None:
        raise GalleryError(f"gallery {folder} has values the payload index cannot hold")
    return payload.facets(allowed, wanted)
