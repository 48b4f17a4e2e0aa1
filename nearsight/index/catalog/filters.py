"""Search filters on the catalog, parsed: ``KEY=VALUE``, ``KEY!=VALUE``, ``KEY>=V``, ``KEY>V``,
``KEY<=V``, ``KEY<V``; several filters must all hold.

``KEY=`` (nothing after ``=``) selects the items without a value for KEY, ``KEY!=`` the items
with one. ``KEY!=VALUE`` holds for every item whose value differs, items without a value
included. A value that starts with ``=``, ``<`` or ``>`` (``shop==Café``, ``price<<5``) is
refused as a typo. Date and datetime columns (nearsight/data/meta.py) take ISO dates with
every operator: ``added>=2025-06-01``.

Any of several values: ``brand=A|B`` selects items whose brand is A or B, ``brand!=A|B``
those whose brand is neither (a literal ``|`` is written ``\\|``); the values are a tuple in
:attr:`Condition.value`, typed one by one, and evaluated as the union of their value sets.

A parsed filter holds text; the gallery reads it with its column's type
(nearsight/index/catalog/filter_types.py) and runs it as one SQL query
(nearsight/index/catalog/filter_sql.py) or on its columns read into arrays
(nearsight/index/catalog/column_filter.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nearsight.data.meta import FilterError, MetaValue, _short, check_key, iso_datetime

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
    if op in RANGE_OPERATORS and parse_number(value) is None and iso_datetime(value) is None:
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
        values.append(alternative)
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


def parse_number(text: str) -> int | float | None:
    """``text`` as a number, or None (in a number column "0042" is 42)."""
    if re.fullmatch(r"[+-]?\d{1,18}", text):
        return int(text)
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        number = float(text)
        return number if math.isfinite(number) else None
    return None
