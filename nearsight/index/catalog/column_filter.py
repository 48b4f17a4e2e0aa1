"""Filters evaluated on the catalog's column arrays (nearsight/index/catalog/columns.py) with
exactly the answer of their SQL query (nearsight/index/catalog/filter_sql.py).

SQLite's rules, kept here: a value compares only with values of its kind (a number with
integers and reals, numerically; text with text, bytewise), an integer and a real exactly
(Python's int/float comparison); ``KEY!=V`` holds for items without a value; conditions on
one key test its one value, so each key's ``=`` and ranges narrow one block of its
value-sorted ids per storage class. A condition outside these rules (a value of another type,
a NaN) is left to SQL: :func:`supported` says which.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from nearsight.index.catalog.columns import (
    INTEGER_COLUMNS,
    TEXT_COLUMNS,
    Column,
    Part,
    Snapshot,
    contains,
    text_bounds,
)
from nearsight.index.catalog.filters import Condition

_INT64 = np.iinfo(np.int64)


def supported(conditions: Sequence[Condition]) -> bool:
    """Whether every condition (typed) is one the arrays answer as SQLite would."""
    for condition in conditions:
        if isinstance(condition.value, tuple):  # any of: each value as one condition
            if not supported([Condition(condition.key, condition.op, v) for v in condition.values]):
                return False
            continue
        value = condition.value
        if value is None:
            continue
        if isinstance(value, tuple):  # any-of: the payload index answers it, the columns not
            return False
        if isinstance(value, str):
            if condition.key in INTEGER_COLUMNS:  # SQLite would turn the text into a number
                return False
            try:
                value.encode("utf-8")
            except UnicodeError:
                return False
        elif isinstance(value, int | float):
            if condition.key in TEXT_COLUMNS or (isinstance(value, float) and math.isnan(value)):
                return False
        else:
            return False
    return True


# a set of more than 1/MASK_SHARE of the id span is looked up in a bitmap (no sort); the
# answer's first set is sorted unless over 1/LIST_SHARE of the span (then read off a bitmap)
MASK_SHARE, LIST_SHARE = 32, 4


@dataclass(frozen=True)
class Blocks:
    """Arrays of item ids, each unordered (disjoint but for a tag column's): a set not yet
    put in order."""

    parts: list[np.ndarray]

    @property
    def size(self) -> int:
        return sum(len(block) for block in self.parts)

    def mask(self, low: int, span: int) -> np.ndarray:
        mask = np.zeros(span, dtype=bool)
        for block in self.parts:
            mask[block - low] = True
        return mask

    def sorted_ids(self, low: int, span: int) -> np.ndarray:
        """The ids in order (read off a bitmap when they are many)."""
        if self.size * LIST_SHARE > span:
            return np.flatnonzero(self.mask(low, span)) + low
        if len(self.parts) == 1 and (np.diff(self.parts[0]) > 0).all():
            return self.parts[0]
        # unique: a tag column's blocks (several tags of one item) may overlap
        return np.unique(np.concatenate([np.zeros(0, np.int64), *self.parts]))

    def holds(self, candidates: np.ndarray, low: int, span: int) -> np.ndarray:
        """Which of ``candidates`` (item ids, sorted) are in the set."""
        if not len(candidates) or not self.size:
            return np.zeros(len(candidates), dtype=bool)
        if self.size * MASK_SHARE > span:
            return self.mask(low, span)[candidates - low]
        return contains(self.sorted_ids(low, span), candidates)


def evaluate(
    conditions: Sequence[Condition], snapshot: Snapshot, check: Callable[[], None]
) -> np.ndarray:
    """Sorted int64 ids of the items meeting every condition; ``check`` is called between
    keys (it raises past the filter's time budget)."""
    by_key: dict[str, list[Condition]] = {}
    for condition in dict.fromkeys(conditions):
        by_key.setdefault(condition.key, []).append(condition)
    all_ids = snapshot.all_ids
    if not len(all_ids):
        return all_ids.astype(np.int64, copy=True)
    low, span = int(all_ids[0]), int(all_ids[-1] - all_ids[0]) + 1
    wanted: list[Blocks] = []  # every item must be in each
    unwanted: list[Blocks] = []  # no item may be in any
    for key, on_key in by_key.items():
        column = snapshot.columns[key]
        holds = [c for c in on_key if c.value is not None and c.op != "!="]
        any_of = [c for c in holds if isinstance(c.value, tuple)]  # a union of value sets
        holds = [c for c in holds if not isinstance(c.value, tuple)]
        differs = [c for c in on_key if c.value is not None and c.op == "!="]
        if holds:
            wanted.append(Blocks(_holding(column, holds)))
        for condition in any_of:
            wanted.append(Blocks(_value_blocks(column, condition.values)))
        if differs:
            values = dict.fromkeys(v for c in differs for v in c.values)
            unwanted.append(Blocks(_value_blocks(column, tuple(values))))
        for condition in on_key:
            if condition.value is None:  # KEY= : no value; KEY!= : a value
                (unwanted if condition.op == "=" else wanted).append(Blocks([column.has]))
        check()
    wanted.sort(key=lambda found: found.size)
    found = wanted[0].sorted_ids(low, span) if wanted else all_ids
    for ids in wanted[1:]:
        found = found[ids.holds(found, low, span)]
        check()
    for ids in unwanted:
        found = found[~ids.holds(found, low, span)]
        check()
    return found.astype(np.int64, copy=False)


def _holding(column: Column, holds: list[Condition]) -> list[np.ndarray]:
    """The ids whose value meets every condition of ``holds`` (``=`` and ranges): one block
    per storage class."""
    blocks = []
    for storage, part in column.parts.items():
        low, high = 0, len(part.ids)
        for condition in holds:
            start, stop = _span(part, storage, condition)
            low, high = max(low, start), min(high, stop)
        if low < high:
            blocks.append(part.ids[low:high])
    return blocks


def _value_blocks(column: Column, values: tuple) -> list[np.ndarray]:
    """The ids holding each of ``values`` (distinct): disjoint blocks, one per value and part."""
    return [block for value in values for storage, part in column.parts.items()
            if len(block := _block(part, storage, Condition("", "=", value)))]  # fmt: skip


def _block(part: Part, storage: str, condition: Condition) -> np.ndarray:
    """The ids of ``part`` whose value equals ``condition``'s."""
    start, stop = _span(part, storage, Condition(condition.key, "=", condition.value))
    return part.ids[start:stop] if start < stop else part.ids[:0]


def _span(part: Part, storage: str, condition: Condition) -> tuple[int, int]:
    """The positions [start, stop) of ``part``'s value order that meet ``condition``."""
    value, size = condition.value, len(part.ids)
    if isinstance(value, str) != (storage == "text"):  # another kind: never equal, no order
        return 0, 0
    if storage == "text":
        below, upto = text_bounds(part, str(value).encode("utf-8"))
    elif not isinstance(value, int | float):  # the condition's one value, here a number
        raise TypeError(f"{condition} compares a number part with {value!r}")
    elif storage == "integer":
        below, upto = _integer_bounds(part.numbers(), value)
    else:
        below, upto = _real_bounds(part.numbers(), value)
    return {
        "=": (below, upto),
        "<": (0, below),
        "<=": (0, upto),
        ">": (upto, size),
        ">=": (below, size),
    }[condition.op]


def _integer_bounds(values: np.ndarray, value: int | float) -> tuple[int, int]:
    """(how many of the sorted int64 ``values`` are < ``value``, how many <= it), exactly."""
    if isinstance(value, float):
        if math.isinf(value):
            return (len(values),) * 2 if value > 0 else (0, 0)
        below = _count_up_to(values, math.ceil(value) - 1)  # x < v: x <= ceil(v) - 1
        return below, _count_up_to(values, math.floor(value))
    return _count_up_to(values, value - 1), _count_up_to(values, value)


def _count_up_to(values: np.ndarray, bound: int) -> int:
    """How many of the sorted int64 ``values`` are <= ``bound`` (any Python int)."""
    if bound < _INT64.min:
        return 0
    if bound >= _INT64.max:
        return len(values)
    return int(np.searchsorted(values, np.int64(bound), side="right"))


def _real_bounds(values: np.ndarray, value: int | float) -> tuple[int, int]:
    """(how many of the sorted float64 ``values`` are < ``value``, how many <= it), exactly:
    ``value``'s nearest double splits them, and the reals equal to it compare with ``value``
    as that double does (Python compares int and float exactly)."""
    try:
        near = float(value)
    except OverflowError:  # an int beyond the doubles
        near = math.copysign(math.inf, value)
    start = int(np.searchsorted(values, near, side="left"))
    stop = int(np.searchsorted(values, near, side="right"))
    if near == value:
        return start, stop
    return (stop, stop) if near < value else (start, start)
