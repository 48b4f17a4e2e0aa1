"""Filters run as one SQL query over the catalog (:func:`filter_sql`, :func:`run_filter`).

The built-in item columns (``label``, ``class_name``, ``split``, ``width``, ``height``,
``id``) are read from ``items``, other keys from ``item_meta`` (one row per item and key, the
value stored with SQLite's own int/real/text type). :func:`run_filter` runs the query on its
own read-only connection, with a time budget, on conditions typed already
(nearsight/index/catalog/filter_types.py). A catalog filtered more than once answers from its
columns read into arrays instead, with the same ids (nearsight/index/catalog/columns.py,
column_filter.py); this query is the first answer and the reference.

The budget is the filter's own work, the CPU time of the thread running it: past it the filter
is the client's to narrow (a FilterError). A filter that stays within it but waits for the CPU
(a busy server) is stopped at :data:`BUSY_FACTOR` times the budget in wall time with
:class:`~nearsight.core.errors.Busy` (503: retry), never blamed on the client.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np

from nearsight.core.errors import Busy
from nearsight.data.meta import FilterError, MetaValue
from nearsight.index.catalog.filters import (
    FILTERABLE_BUILTINS,
    RANGE_OPERATORS,
    Condition,
    merge_conditions,
)
from nearsight.index.errors import GalleryError

BUSY_FACTOR = 2.0


def filter_sql(
    conditions: Sequence[Condition], *, has_meta_table: bool, list_keys: Collection[str] = ()
) -> tuple[str, list[MetaValue]]:
    """``SELECT id FROM items WHERE ...`` holding ``conditions`` (all of them), with its
    parameters. Conditions on one metadata key share one look-up of ``item_meta`` (an item
    has one value per key, so they all test that value). Without an ``item_meta`` table (a
    catalog older than metadata) a condition on a metadata key matches nothing. A tag
    column's (``list_keys``) conditions test each tag of its stored ``a|b|c`` text."""
    clauses: list[str] = []
    params: list[MetaValue] = []
    by_key: dict[str, list[Condition]] = {}
    for condition in merge_conditions(conditions, max_conditions=len(conditions)):
        numeric = condition.op in RANGE_OPERATORS
        if condition.value is None:  # KEY= (no value) or KEY!= (a value)
            clauses.append(_presence(condition, has_meta_table))
            params.extend([] if condition.key in FILTERABLE_BUILTINS or not has_meta_table
                          else [condition.key])  # fmt: skip
            continue
        if condition.key in FILTERABLE_BUILTINS:
            column = condition.key
            if isinstance(condition.value, tuple):  # any of
                marks = ", ".join("?" * len(condition.value))
                clauses.append(f"{column} IN ({marks})" if condition.op == "=" else
                               f"({column} IS NULL OR {column} NOT IN ({marks}))")  # fmt: skip
                params.extend(_builtin_value(column, v) for v in condition.value)
                continue
            if numeric:
                clauses.append(
                    f"(typeof({column}) IN ('integer', 'real') AND {column} {condition.op} ?)"
                )
            elif condition.op == "!=":
                clauses.append(f"({column} IS NULL OR {column} != ?)")
            else:
                clauses.append(f"{column} = ?")
            params.append(_builtin_value(column, condition.value))
            continue
        if not has_meta_table:
            clauses.append("1 = 0" if condition.op != "!=" else "1 = 1")
            continue
        if condition.key in list_keys:  # an item holding one of the tags, or none of them
            tags = " OR ".join(["instr('|' || value || '|', '|' || ? || '|') > 0"]
                               * len(condition.values))  # fmt: skip
            inside = "IN" if condition.op == "=" else "NOT IN"
            clauses.append(f"id {inside} (SELECT item_id FROM item_meta WHERE key = ? AND "
                           f"typeof(value) = 'text' AND ({tags}))")  # fmt: skip
            params.extend([condition.key, *(str(v) for v in condition.values)])
            continue
        by_key.setdefault(condition.key, []).append(condition)
    for key, on_key in by_key.items():
        holds = [c for c in on_key if c.op != "!="]
        differs = [c for c in on_key if c.op == "!="]
        if holds:
            tests = []
            for condition in holds:
                if isinstance(condition.value, tuple):  # any of
                    tests.append(f"(value IN ({', '.join('?' * len(condition.value))}))")
                    continue
                test = f"value {condition.op} ?"
                if condition.op in RANGE_OPERATORS and isinstance(condition.value, str):
                    test = f"typeof(value) = 'text' AND {test}"  # ISO dates: time order
                elif condition.op in RANGE_OPERATORS:
                    test = f"typeof(value) IN ('integer', 'real') AND {test}"
                tests.append(f"({test})")
            clauses.append(
                f"id IN (SELECT item_id FROM item_meta WHERE key = ? AND {' AND '.join(tests)})"
            )
            params.extend([key, *(v for c in holds for v in c.values)])
        if differs:  # an item without the key differs from the value too
            unwanted = [v for c in differs for v in c.values]
            marks = ", ".join("?" * len(unwanted))
            clauses.append(
                f"id NOT IN (SELECT item_id FROM item_meta WHERE key = ? AND value IN ({marks}))"
            )
            params.extend([key, *unwanted])
    where = " AND ".join(clauses) if clauses else "1 = 1"
    return f"SELECT id FROM items WHERE {where} ORDER BY id", params


def _presence(condition: Condition, has_meta_table: bool) -> str:
    """The clause of ``KEY=`` (the item has no value for KEY) or ``KEY!=`` (it has one)."""
    wanted_missing = condition.op == "="
    if condition.key in FILTERABLE_BUILTINS:
        return f"{condition.key} IS {'' if wanted_missing else 'NOT '}NULL"
    if not has_meta_table:
        return "1 = 1" if wanted_missing else "1 = 0"
    inside = "NOT IN" if wanted_missing else "IN"
    return f"id {inside} (SELECT item_id FROM item_meta WHERE key = ?)"


def _builtin_value(column: str, value: MetaValue) -> MetaValue:
    """``value`` as a built-in ``column`` stores it (class names and splits are text)."""
    return str(value) if column in ("class_name", "split") else value


def budget(time_limit_s: float) -> tuple[Callable[[], bool], Callable[[], None]]:
    """(whether the filter is past its budget, a check that raises if it is): past
    ``time_limit_s`` of its thread's CPU time a FilterError (the client's to narrow), past
    :data:`BUSY_FACTOR` times it in wall time :class:`~nearsight.core.errors.Busy`."""
    work_deadline = time.thread_time() + time_limit_s
    deadline = time.monotonic() + time_limit_s * BUSY_FACTOR

    def over() -> bool:
        return time.thread_time() > work_deadline or time.monotonic() > deadline

    def check() -> None:
        if time.thread_time() > work_deadline:
            raise FilterError(
                f"the filter took longer than {time_limit_s:g} s of work: narrow it"
            ) from None
        if time.monotonic() > deadline:
            raise Busy(
                f"the server is busy: the filter did not finish within "
                f"{time_limit_s * BUSY_FACTOR:g} s (retry)"
            ) from None

    return over, check


def run_filter(
    path: Path,
    conditions: Sequence[Condition],
    has_meta_table: bool,
    time_limit_s: float,
    list_keys: Collection[str] = (),
) -> np.ndarray:
    """Sorted int64 ids of the items of the catalog at ``path`` meeting every condition
    (typed already: :func:`typed_conditions`; ``list_keys``: the tag columns)."""
    sql, params = filter_sql(conditions, has_meta_table=has_meta_table, list_keys=list_keys)
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as error:
        raise GalleryError(f"cannot open gallery catalog {path.name}: {error}") from None
    over, raise_over = budget(time_limit_s)
    conn.set_progress_handler(over, 10_000)
    try:
        rows = conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as error:
        raise_over()
        raise FilterError(f"the filter is too complex for the catalog ({error})") from None
    except sqlite3.DatabaseError as error:
        raise GalleryError(f"gallery catalog {path.name} is damaged: {error}") from None
    finally:
        conn.close()
    return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
