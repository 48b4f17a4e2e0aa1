"""Filters read with their columns' types (:func:`typed_conditions`).

A filter's value is read with the stored type of its column: a text column compares text, so
``sku=1003`` matches the text ``"1003"``; a number column compares numbers, so ``price<10``
is numeric. A range operator on a text column is an error naming the column's type.
``label=NAME`` and ``class_name=NAME`` resolve a class name; a name the gallery lacks is an
error that lists the closest names. A key the gallery does not have is an error too (a typo
is not "no match").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from nearsight.core.errors import closest_names
from nearsight.data.meta import DATE_TYPES, FilterError, MetaValue, _short, iso_date, iso_datetime
from nearsight.index.catalog.filters import (
    FILTERABLE_BUILTINS,
    RANGE_OPERATORS,
    Condition,
    parse_number,
)

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
        key, op = condition.key, condition.op
        if isinstance(condition.value, tuple):  # any of: each value typed by the column
            each = [_typed_value(Condition(key, op, value), value, kind, names)
                    for value in condition.value]  # fmt: skip
            typed.append(Condition(key, op, tuple(dict.fromkeys(each))))
        elif condition.value is None:  # KEY= / KEY!= : whether the item has a value at all
            typed.append(condition)
        else:
            typed.append(Condition(key, op, _typed_value(condition, condition.value, kind, names)))
    return typed


def _typed_value(
    condition: Condition, value: MetaValue, kind: str, names: Mapping[str, int]
) -> MetaValue:
    """``value``, the one value of ``condition``, read as ``kind``, its column's type."""
    text = str(value).strip()
    typed: MetaValue | None
    if kind in DATE_TYPES:
        day = iso_date(text) if kind == "date" else iso_datetime(text)
        if day is None:
            example = "YYYY-MM-DD" if kind == "date" else "YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS"
            raise FilterError(
                f"bad filter {_short(str(condition))!r}: {condition.key} holds {kind}s "
                f"({example}), and {_short(text)!r} is not one"
            )
        return str(day)
    if condition.key == "label" and parse_number(text) is None:  # a class name
        _check_name(condition, text, names)
        typed = names[text]
    elif condition.key == "class_name":
        _check_name(condition, text, names)
        typed = text
    elif kind in NUMBER_TYPES:
        typed = value if isinstance(value, int | float) else parse_number(text)
        if typed is None:
            raise FilterError(
                f"bad filter {_short(str(condition))!r}: {condition.key} holds numbers, "
                f"and {_short(text)!r} is not one"
            )
    else:
        typed = text
    if condition.op in RANGE_OPERATORS and not isinstance(typed, int | float):
        raise FilterError(
            f"bad filter {_short(str(condition))!r}: {condition.key} is a text column; "
            f"{condition.op} compares numbers (use = or != for text)"
        )
    return typed


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
