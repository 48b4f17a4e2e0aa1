"""Search filters on the catalog: ``KEY=VALUE``, ``KEY!=VALUE``, ``KEY>=V``, ``KEY>V``,
``KEY<=V``, ``KEY<V``; several filters must all hold.

``KEY=`` (nothing after ``=``) selects the items without a value for KEY, ``KEY!=`` the items
with one. ``KEY!=VALUE`` holds for every item whose value differs, items without a value
included. A value that starts with ``=``, ``<`` or ``>`` (``shop==Café``, ``price<<5``) is
refused as a typo. Date and datetime columns (nearsight/data/meta.py) take ISO dates with
every operator: ``added>=2025-06-01``.

Any of several values: ``brand=A|B`` selects items whose brand is A or B, ``brand!=A|B``
those whose brand is neither (a literal ``|`` is written ``\\|``); the values are a tuple in
:attr:`Condition.value`, typed one by one, and evaluated as the union of their value sets.

A filter's value is read with the stored type of its column (:func:`typed_conditions`): a text
column compares text, so ``sku=1003`` matches the text ``"1003"``; a number column compares
numbers, so ``price<10`` is numeric. A range operator on a text column is an error naming the
column's type. ``label=NAME`` and ``class_name=NAME`` resolve a class name; a name the gallery
lacks is an error that lists the closest names.

Filters are turned into one SQL query over the catalog (:func:`filter_sql`): the built-in
item columns (``label``, ``class_name``, ``split``, ``width``, ``height``, ``id``) are read
from ``items``, other keys from ``item_meta`` (one row per item and key, the value stored with
SQLite's own int/real/text type). :func:`run_filter` runs it on its own read-only connection,
with a time budget, after refusing keys the gallery does not have (a typo is not "no match").
A catalog filtered more than once answers from its columns read into arrays instead, with the
same ids (nearsight/index/catalog/columns.py, column_filter.py); this query is the first
answer and the reference.

The budget is the filter's own work, the CPU time of the thread running it: past it the filter
is the client's to narrow (a FilterError). A filter that stays within it but waits for the CPU
(a busy server) is stopped at :data:`BUSY_FACTOR` times the budget in wall time with
:class:`~nearsight.core.errors.Busy` (503: retry), never blamed on the client.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

from nearsight.core.errors import Busy, closest_names
from nearsight.data.meta import (
    DATE_TYPES,
    FilterError,
    MetaValue,
    _short,
    check_key,
    iso_date,
    iso_datetime,
)
from nearsight.index.errors import GalleryError

BUSY_FACTOR = 2.0

FILTERABLE_BUILTINS = ("id", "label", "class_name", "split", "width", "height")
OPERATORS = (">=", "<=", "!=", ">", "<", "=")  # longest first: ">=" before ">" and "="
RANGE_OPERATORS = (">=", "<=", ">", "<")
MAX_FILTER_CONDITIONS = 32  # distinct conditions in one search; serve/search raise it by a flag
_FILTER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(>=|<=|!=|>|<|=)(.*)", re.DOTALL)


@dataclass(frozen=True)
class Condition:
    """One filter: ``key`` ``op`` ``value``."""

    key: str
    op: str
    # None: "has no value" (KEY=) or "has one" (KEY!=); a tuple: any of these values
    value: MetaValue | tuple[MetaValue, ...] | None

    def __str__(self) -> str:
        if isinstance(self.value, tuple):
            shown = "|".join(str(v).replace("|", "\\|") for v in self.value)
            return f"{self.key}{self.op}{shown}"
        shown = "" if self.value is None else str(self.value).replace("|", "\\|")
        return f"{self.key}{self.op}{shown}"

    @property
    def values(self) -> tuple[MetaValue, ...]:
        """The values the condition names (one, or an any-of's several; none for KEY=)."""
        if self.value is None:
            return ()
        return self.value if isinstance(self.value, tuple) else (self.value,)

    def alternatives(self) -> list[Condition]:
        """This condition once per value of an any-of (itself when it has one value)."""
        if isinstance(self.value, tuple):
            return [Condition(self.key, self.op, value) for value in self.value]
        return [self]


def split_any_of(text: str) -> list[str]:
    """``text`` cut at each ``|`` not written ``\\|`` (which stands for a literal ``|``)."""
    parts = re.split(r"(?<!\\)\|", text)
    return [part.replace("\\|", "|") for part in parts]


def parse_filter(text: str) -> Condition:
    """One filter string, e.g. ``shop=north``, ``price>=10``, ``price<25.5``."""
    match = _FILTER.fullmatch(text)
    if not match:
        raise FilterError(
            f"bad filter {_short(text)!r}: use KEY=VALUE, KEY!=VALUE, KEY>=N, KEY>N, KEY<=N or KEY<N"
        )
    key, op, raw = match.group(1), match.group(2), match.group(3)
    check_key(key, builtin_ok=True)
    if key == "path" or key == "sha256":
        raise FilterError(f"cannot filter on {key!r}")
    value = raw.strip()  # text: typed by its column when the gallery runs it
    if value[:1] in ("=", "<", ">"):
        fixed = f"{key}{op}{value.lstrip('=<>').strip()}"
        raise FilterError(
            f"bad filter {_short(text)!r}: the value starts with {value[0]!r}, a typo? "
            f"(one operator: {_short(fixed)!r})"
        )
    if not value:
        if op in ("=", "!="):  # KEY= : items without a value; KEY!= : items with one
            return Condition(key, op, None)
        raise FilterError(f"bad filter {_short(text)!r}: no value after {op!r}")
    alternatives = split_any_of(value)
    if len(alternatives) > 1 or "\\|" in value:
        if op not in ("=", "!="):
            raise FilterError(f"bad filter {_short(text)!r}: A|B (any of) takes = or !=, not {op}")
        return _any_of(key, op, alternatives, text)
    if op in RANGE_OPERATORS and _number(value) is None and iso_datetime(value) is None:
        raise FilterError(
            f"bad filter {_short(text)!r}: {op} needs a number or an ISO date (YYYY-MM-DD), "
            f"got {_short(value)!r}"
        )
    return Condition(key, op, value)


def _any_of(key: str, op: str, alternatives: Sequence[object], text: str) -> Condition:
    """``key op A|B|...``: a tuple of the distinct values (one value: a plain condition)."""
    values: list[MetaValue] = []
    for alternative in alternatives:
        if isinstance(alternative, bool):
            alternative = int(alternative)
        if not isinstance(alternative, int | float):
            alternative = str(alternative).strip()
            if not alternative:
                raise FilterError(f"bad filter {_short(text)!r}: an empty value in A|B (any of)")
        values.append(alternative)  # type: ignore[arg-type]
    unique = tuple(dict.fromkeys(values))
    return Condition(key, op, unique if len(unique) > 1 else unique[0])


def parse_filters(texts: Iterable[str] | Mapping[str, object] | str | None) -> list[Condition]:
    """Several filters (all must hold). A single string may hold several, separated by ';' or
    newlines (the page's and the REST API's one text field). A mapping (Python callers) is
    one ``KEY=VALUE`` per entry; a None value asks for items without the key, a list any of
    its values."""
    if texts is None:
        return []
    if isinstance(texts, Mapping):
        return [_entry_condition(str(key), value) for key, value in texts.items()]
    if isinstance(texts, str):
        texts = [texts]
    parts: list[str] = []
    for text in texts:
        parts.extend(part for part in re.split(r"[;\n]", text) if part.strip())
    return [parse_filter(part) for part in parts]


def _entry_condition(key: str, value: object) -> Condition:
    """``{key: value}`` of a dict filter: ``key=value`` (the value as given, never split)."""
    check_key(key, builtin_ok=True)
    if key in ("path", "sha256"):
        raise FilterError(f"cannot filter on {key!r}")
    if value is None or (isinstance(value, str) and not value.strip()):
        return Condition(key, "=", None)
    if isinstance(value, list | tuple | set | frozenset):
        if not value:
            raise FilterError(f"bad filter {key!r}: an empty list of values (any of)")
        return _any_of(key, "=", sorted(value, key=str) if isinstance(value, set | frozenset)
                       else list(value), f"{key}={value}")  # fmt: skip
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int | float):
        return Condition(key, "=", value)
    return Condition(key, "=", str(value).strip())


def merge_conditions(
    conditions: Sequence[Condition], max_conditions: int | None = None
) -> list[Condition]:
    """``conditions`` with repeats removed (first occurrence kept); a FilterError when more
    than ``max_conditions`` (default :data:`MAX_FILTER_CONDITIONS`) distinct ones remain."""
    limit = MAX_FILTER_CONDITIONS if max_conditions is None else max_conditions
    merged = list(dict.fromkeys(conditions))
    if len(merged) > limit:
        raise FilterError(
            f"{len(merged)} distinct filter conditions: the limit is {limit} "
            "(serve and search raise it with --max-filter-conditions)"
        )
    return merged


BUILTIN_TYPES = {"id": "int", "label": "int", "width": "int", "height": "int",
                 "class_name": "str", "split": "str"}  # fmt: skip
NUMBER_TYPES = ("int", "float")


def typed_conditions(
    conditions: Sequence[Condition],
    column_types: Mapping[str, str],
    class_names: Mapping[int, str],
    list_columns: Collection[str] = (),
) -> list[Condition]:
    """``conditions`` with each value read as its column's type (``column_types``: the
    gallery's metadata columns, ``int``/``float``/``str``; the built-in columns have theirs);
    ``label=NAME`` becomes the label number of class NAME (``class_names``: label -> name).
    A key the gallery does not have is an error listing the keys it has. A condition with a
    value on a tag column (``list_columns``) becomes an any-of, even of one value: a test of
    the item's set of tags (nearsight/index/catalog/list_columns.py)."""
    known = {**column_types, **BUILTIN_TYPES}
    names = {name: label for label, name in sorted(class_names.items(), reverse=True)}
    typed = []
    for condition in conditions:
        kind = known.get(condition.key)
        if kind is None:
            keys = ", ".join([*sorted(column_types), *FILTERABLE_BUILTINS])
            raise FilterError(
                f"unknown filter key {_short(condition.key)!r}: this gallery's keys are {keys}"
            )
        if condition.key in list_columns and condition.value is not None:
            if condition.op not in ("=", "!="):
                raise FilterError(
                    f"bad filter {_short(str(condition))!r}: {condition.key} is a tag column; "
                    f"it takes = or !=, not {condition.op}"
                )
            condition = Condition(condition.key, condition.op, condition.values)
        if isinstance(condition.value, tuple):  # any of: each value typed by the column
            each = [_typed(Condition(condition.key, condition.op, value), kind, names).value
                    for value in condition.value]  # fmt: skip
            typed.append(Condition(condition.key, condition.op, tuple(dict.fromkeys(each))))  # type: ignore[arg-type]
        else:
            typed.append(_typed(condition, kind, names))
    return typed


def _typed(condition: Condition, kind: str, names: Mapping[str, int]) -> Condition:
    """``condition`` (one value) with its value read as ``kind``, its column's type."""
    value = condition.value
    text = str(value).strip()
    if value is None:  # KEY= / KEY!= : whether the item has a value at all
        return condition
    if kind in DATE_TYPES:
        value = iso_date(text) if kind == "date" else iso_datetime(text)
        if value is None:
            example = "YYYY-MM-DD" if kind == "date" else "YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS"
            raise FilterError(
                f"bad filter {_short(str(condition))!r}: {condition.key} holds {kind}s "
                f"({example}), and {_short(text)!r} is not one"
            )
        return Condition(condition.key, condition.op, str(value))
    if condition.key == "label" and _number(text) is None:  # a class name
        _check_name(condition, text, names)
        value = names[text]
    elif condition.key == "class_name":
        _check_name(condition, text, names)
        value = text
    elif kind in NUMBER_TYPES:
        value = value if isinstance(value, int | float) else _number(text)
        if value is None:
            raise FilterError(
                f"bad filter {_short(str(condition))!r}: {condition.key} holds numbers, "
                f"and {_short(text)!r} is not one"
            )
    else:
        value = text
    if condition.op in RANGE_OPERATORS and not isinstance(value, int | float):
        raise FilterError(
            f"bad filter {_short(str(condition))!r}: {condition.key} is a text column; "
            f"{condition.op} compares numbers (use = or != for text)"
        )
    return Condition(condition.key, condition.op, value)


def _number(text: str) -> int | float | None:
    """``text`` as a number, or None (in a number column "0042" is 42)."""
    if re.fullmatch(r"[+-]?\d{1,18}", text):
        return int(text)
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        number = float(text)
        return number if math.isfinite(number) else None
    return None


def _check_name(condition: Condition, name: str, names: Mapping[str, int]) -> None:
    if condition.op in RANGE_OPERATORS:
        raise FilterError(
            f"bad filter {_short(str(condition))!r}: a class name takes = or !=, not {condition.op}"
        )
    if name not in names:
        raise FilterError(
            f"bad filter {_short(str(condition))!r}: the gallery has no class named "
            f"{_short(name)!r}; {closest_names(name, names)}"
        )


def filter_sql(
    conditions: Sequence[Condition], *, has_meta_table: bool, list_keys: Collection[str] = ()
) -> tuple[str, list]:
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
                params.extend(_builtin_value(Condition(column, "=", v)) for v in condition.value)
                continue
            if numeric:
                clauses.append(
                    f"(typeof({column}) IN ('integer', 'real') AND {column} {condition.op} ?)"
                )
            elif condition.op == "!=":
                clauses.append(f"({column} IS NULL OR {column} != ?)")
            else:
                clauses.append(f"{column} = ?")
            params.append(_builtin_value(condition))
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


def _builtin_value(condition: Condition) -> MetaValue:
    if condition.key in ("class_name", "split"):
        return str(condition.value)
    return condition.value


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
