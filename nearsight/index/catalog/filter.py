"""Running a catalog filter: on its own read-only connection, with a time budget, after
refusing keys the gallery does not have (a typo is not "no match")."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np

from nearsight.index.search.filters import FILTERABLE_BUILTINS, Condition, FilterError, filter_sql


def run_filter(
    path: Path,
    conditions: Sequence[Condition],
    known: set[str],
    has_meta_table: bool,
    time_limit_s: float,
) -> np.ndarray:
    """Sorted int64 ids of the items of the catalog at ``path`` meeting every condition;
    ``known``: the gallery's metadata columns."""
    from nearsight.index.catalog.store import GalleryError

    unknown = [c.key for c in conditions if c.key not in known | set(FILTERABLE_BUILTINS)]
    if unknown:
        keys = ", ".join([*sorted(known), *FILTERABLE_BUILTINS])
        raise FilterError(
            f"unknown filter key {unknown[0]!r}: this gallery's keys are {keys}"
        )
    sql, params = filter_sql(conditions, has_meta_table=has_meta_table)
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as error:
        raise GalleryError(f"cannot open gallery catalog {path.name}: {error}") from None
    deadline = time.monotonic() + time_limit_s
    conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        rows = conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as error:
        if time.monotonic() > deadline:
            raise FilterError(
                f"the filter took longer than {time_limit_s:g} s: narrow it"
            ) from None
        raise FilterError(f"the filter is too complex for the catalog ({error})") from None
    except sqlite3.DatabaseError as error:
        raise GalleryError(f"gallery catalog {path.name} is damaged: {error}") from None
    finally:
        conn.close()
    return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
