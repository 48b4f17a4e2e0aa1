"""Item metadata values and search filters: ``KEY=VALUE``, ``KEY!=VALUE``, ``KEY>=V``,
``KEY>V``, ``KEY<=V``, ``KEY<V``; several filters must all hold.

A metadata value is typed when it is read (from a CSV column or ``--meta KEY=VALUE``): text
that reads as an integer or a finite decimal number is stored as a number, anything else as
text; an empty value is no value. A filter's value is typed the same way, so ``price<10``
compares numbers and ``shop=north`` compares text. Range operators hold only for numbers.

Filters are turned into one SQL query over the catalog (:func:`filter_sql`): the built-in
item columns (``label``, ``class_name``, ``split``, ``width``, ``height``, ``id``) are read
from ``items``, other keys from ``item_meta`` (one row per item and key, the value stored with
SQLite's own int/real/text type).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nearsight.core.errors import NearsightError

MetaValue = int | float | str
# keys the catalog's items table holds itself; metadata may not reuse them
BUILTIN_KEYS = ("id", "path", "label", "class_name", "split", "sha256", "width", "height")
FILTERABLE_BUILTINS = ("id", "label", "class_name", "split", "width", "height")
KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
OPERATORS = (">=", "<=", "!=", ">", "<", "=")  # longest first: ">=" before ">" and "="
RANGE_OPERATORS = (">=", "<=", ">", "<")
MAX_FILTER_CONDITIONS = 32  # distinct conditions in one search; serve/search raise it by a flag
MAX_ECHO_CHARS = 80  # a message quoting a filter quotes at most this much of it
_FILTER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(>=|<=|!=|>|<|=)(.*)", re.DOTALL)


class FilterError(NearsightError, ValueError):
    """A filter or metadata entry that cannot be understood (a ValueError too, as Python code
    expects of a bad argument)."""


@dataclass(frozen=True)
class Condition:
    """One filter: ``key`` ``op`` ``value``."""

    key: str
    op: str
    value: MetaValue

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


def _short(text: str) -> str:
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."


def typed_value(text: str) -> MetaValue | None:
    """``text`` as an int, a float or stripped text; None when empty."""
    value = text.strip()
    if not value:
        return None
    if re.fullmatch(r"[+-]?(0|[1-9]\d{0,17})", value):  # "007" stays text (a code, not 7)
        return int(value)
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value) or re.match(
        r"[+-]?0\d", value
    ):
        return value  # "inf", "nan", "1_000", "0042.5": text
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def check_key(key: str, *, builtin_ok: bool = False) -> str:
    key = key.strip()
    if not KEY_PATTERN.fullmatch(key):
        raise FilterError(
            f"bad metadata key {_short(key)!r}: use letters, digits, '_', '.', '-' (a letter or '_' "
            "first, at most 64 characters)"
        )
    if not builtin_ok and key in BUILTIN_KEYS:
        raise FilterError(
            f"metadata key {key!r} is a built-in catalog column ({', '.join(BUILTIN_KEYS)}): "
            "rename it"
        )
    return key


def parse_meta_entries(entries: Iterable[str], *, typed: bool = True) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``index add --meta``) as a dict, each value typed by itself (or
    left as text with ``typed=False``, for the gallery's column types); an empty VALUE is
    skipped."""
    meta: dict[str, Any] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        if not sep:
            raise FilterError(f"--meta takes KEY=VALUE, got {entry!r}")
        value = typed_value(text) if typed else (text.strip() or None)
        if value is not None:
            meta[check_key(key)] = value
    return meta


def typed_meta(values: Mapping[str, object]) -> dict[str, MetaValue]:
    """Metadata as the catalog stores it: numbers as they are, text as text (already typed by
    its column, nearsight/index/search/meta_types.py), other values as text; empty values and
    non-finite numbers dropped."""
    meta: dict[str, MetaValue] = {}
    for key, raw in values.items():
        if raw is None:
            continue
        if isinstance(raw, bool):
            raw = int(raw)
        if isinstance(raw, int | float):
            if isinstance(raw, float) and not math.isfinite(raw):
                continue
            meta[check_key(str(key))] = raw
            continue
        value = str(raw).strip()
        if value:
            meta[check_key(str(key))] = value
    return meta


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
    value = typed_value(raw)
    if value is None:
        raise FilterError(f"bad filter {_short(text)!r}: no value after {op!r}")
    if op in RANGE_OPERATORS and isinstance(value, str):
        raise FilterError(
            f"bad filter {_short(text)!r}: {op} needs a number, got {_short(str(value))!r}"
        )
    return Condition(key, op, value)


def parse_filters(texts: Iterable[str] | str | None) -> list[Condition]:
    """Several filters (all must hold). A single string may hold several, separated by ';' or
    newlines (the page's and the REST API's one text field)."""
    if texts is None:
        return []
    if isinstance(texts, str):
        texts = [texts]
    parts: list[str] = []
    for text in texts:
        parts.extend(part for part in re.split(r"[;\n]", text) if part.strip())
    return [parse_filter(part) for part in parts]


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


def filter_sql(conditions: Sequence[Condition], *, has_meta_table: bool) -> tuple[str, list]:
    """``SELECT id FROM items WHERE ...`` holding ``conditions`` (all of them), with its
    parameters. Conditions on one metadata key share one look-up of ``item_meta`` (an item
    has one value per key, so they all test that value). Without an ``item_meta`` table (a
    catalog older than metadata) a condition on a metadata key matches nothing."""
    clauses: list[str] = []
    params: list[MetaValue] = []
    by_key: dict[str, list[Condition]] = {}
    for condition in merge_conditions(conditions, max_conditions=len(conditions)):
        numeric = condition.op in RANGE_OPERATORS
        if condition.key in FILTERABLE_BUILTINS:
            column = condition.key
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
        by_key.setdefault(condition.key, []).append(condition)
    for key, on_key in by_key.items():
        holds = [c for c in on_key if c.op != "!="]
        differs = [c for c in on_key if c.op == "!="]
        if holds:
            tests = []
            for condition in holds:
                test = f"value {condition.op} ?"
                if condition.op in RANGE_OPERATORS:
                    test = f"typeof(value) IN ('integer', 'real') AND {test}"
                tests.append(f"({test})")
            clauses.append(
                f"id IN (SELECT item_id FROM item_meta WHERE key = ? AND {' AND '.join(tests)})"
            )
            params.extend([key, *(c.value for c in holds)])
        if differs:  # an item without the key differs from the value too
            marks = ", ".join("?" * len(differs))
            clauses.append(
                f"id NOT IN (SELECT item_id FROM item_meta WHERE key = ? AND value IN ({marks}))"
            )
            params.extend([key, *(c.value for c in differs)])
    where = " AND ".join(clauses) if clauses else "1 = 1"
    return f"SELECT id FROM items WHERE {where} ORDER BY id", params


def _builtin_value(condition: Condition) -> MetaValue:
    if condition.key in ("class_name", "split"):
        return str(condition.value)
    return condition.value
