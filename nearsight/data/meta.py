"""The typing of item metadata: values, keys, whole columns, and labels given as names.

A metadata value is typed when it is read (from a CSV column or ``--meta KEY=VALUE``): text
that reads as an integer or a finite decimal number is a number, anything else text; an empty
value is no value.

A column is numeric only if every non-empty value in it parses as a number: one ``091`` (a
leading zero: a code, not 91) or one ``n/a`` makes the whole column text, so ``sku<100`` never
half-works. ``--meta-types sku=str,price=float`` declares a column's type instead; a value
that does not parse under its declared type is an error naming the column. A gallery stores
the types it was built with (catalog meta ``meta_types``), and ``index add`` follows them.

ISO dates (``2025-06-01``) and datetimes (``2025-06-01T10:30:00``, or with a space) are
types of their own: a column is ``date`` when every value is an ISO date, ``datetime`` when
every value is a date or a datetime (or declared so: ``--meta-types added=date``). They are
stored as text in one normal form (``YYYY-MM-DD``, ``YYYY-MM-DDTHH:MM:SS[.ffffff]``; a time
with an offset is converted to UTC), so ranges compare them in time order.

Labels: integers as given, or class names anywhere a label is accepted, coded like the CSV
dataset reader codes them: the sorted names are 0, 1, 2, ...
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nearsight.core.errors import NearsightError

MetaValue = int | float | str
# a value as answers give it (search results, REST's items): a tag column's as its tags
AnswerValue = MetaValue | list[str]
# keys the catalog's items table holds itself; metadata may not reuse them
BUILTIN_KEYS = ("id", "path", "label", "class_name", "split", "sha256", "width", "height")
KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
MAX_ECHO_CHARS = 80  # a message quoting a filter quotes at most this much of it
TYPES = ("int", "float", "str", "date", "datetime")
DATE_TYPES = ("date", "datetime")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ISO_DATETIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?"
)


class IsoDate(str):
    """A date value in its normal form ``YYYY-MM-DD`` (text that knows it is a date)."""


class IsoDateTime(str):
    """A datetime value in its normal form ``YYYY-MM-DDTHH:MM:SS[.ffffff]`` (UTC when it had
    an offset)."""


def iso_date(text: str) -> IsoDate | None:
    """``text`` as an :class:`IsoDate`, or None when it is not an ISO date."""
    text = text.strip()
    if not _ISO_DATE.fullmatch(text):
        return None
    try:
        return IsoDate(dt.date.fromisoformat(text).isoformat())
    except ValueError:
        return None


def iso_datetime(text: str) -> IsoDateTime | None:
    """``text`` (an ISO datetime, or a date: its midnight) as an :class:`IsoDateTime`, or
    None."""
    text = text.strip()
    day = iso_date(text)
    if day is not None:
        return IsoDateTime(day + "T00:00:00")
    if not _ISO_DATETIME.fullmatch(text):
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    spec = "microseconds" if moment.microsecond else "seconds"
    return IsoDateTime(moment.isoformat(timespec=spec))


class FilterError(NearsightError, ValueError):
    """A filter or metadata entry that cannot be understood (a ValueError too, as Python code
    expects of a bad argument)."""


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
    its column, nearsight/data/meta.py), other values as text; empty values and
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


def parse_meta_types(texts: Iterable[str] | str | None) -> dict[str, str]:
    """``sku=str,price=float`` (comma-separated, repeatable) as {column: type}."""
    if texts is None:
        return {}
    declared: dict[str, str] = {}
    for text in [texts] if isinstance(texts, str) else texts:
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, kind = part.partition("=")
            kind = kind.strip().lower()
            if not sep or kind not in TYPES:
                raise FilterError(
                    f"--meta-types takes COLUMN=TYPE with TYPE one of {', '.join(TYPES)}, "
                    f"got {part!r}"
                )
            declared[check_key(key)] = kind
    return declared


def infer_types(
    rows: Sequence[Mapping[str, object]], declared: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Each column's type over all ``rows``: ``declared`` where given, else int when every
    non-empty value is an integer, float when every one is a number, else str."""
    declared = dict(declared or {})
    columns: dict[str, list[object]] = {}
    for row in rows:
        for key, value in row.items():
            if not _empty(value):
                columns.setdefault(key, []).append(value)
    types = {}
    for key, values in columns.items():
        if key in declared:
            types[key] = declared[key]
            continue
        kinds = {_kind(value) for value in values}
        types[key] = (
            "int" if kinds == {"int"}
            else "float" if kinds <= {"int", "float"}
            else "date" if kinds == {"date"}
            else "datetime" if kinds <= {"date", "datetime"}
            else "str"
        )  # fmt: skip
    return types  # a declared column no row has stays out


def typed_row(raw: Mapping[str, object], types: Mapping[str, str]) -> dict[str, MetaValue]:
    """One item's metadata typed by its columns' ``types`` (a column absent from ``types``:
    by its own value); empty values are dropped."""
    meta: dict[str, MetaValue] = {}
    for key, value in raw.items():
        if _empty(value):
            continue
        kind = types.get(key) or _kind(value)
        meta[check_key(str(key))] = _as(kind, value, key)
    return meta


def label_codes(values: Sequence[object]) -> tuple[list[int | None], list[str | None]]:
    """(labels, class names) from a label column: integers as they are (no class names), or
    class names coded by their sorted order. Empty values are unlabelled (None)."""
    given = [None if _empty(value) else value for value in values]
    present = [value for value in given if value is not None]
    if all(_kind(value) == "int" for value in present):
        return [None if v is None else int(float(str(v))) for v in given], [None] * len(given)
    names = [None if v is None else str(v).strip() for v in given]
    code = {name: label for label, name in enumerate(sorted({n for n in names if n}))}
    return [None if n is None else code[n] for n in names], names


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _kind(value: object) -> str:
    if isinstance(value, bool | int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, IsoDateTime | dt.datetime):
        return "datetime"
    if isinstance(value, IsoDate | dt.date):
        return "date"
    typed = typed_value(str(value))
    if isinstance(typed, str):
        return "date" if iso_date(typed) else "datetime" if iso_datetime(typed) else "str"
    return "int" if isinstance(typed, int) else "float"


def _as(kind: str, value: Any, key: str) -> MetaValue:
    if kind in DATE_TYPES:
        text = value.isoformat() if isinstance(value, dt.date) else str(value)
        typed = iso_date(text) if kind == "date" else iso_datetime(text)
        if typed is None:
            example = "YYYY-MM-DD" if kind == "date" else "YYYY-MM-DDTHH:MM:SS"
            raise FilterError(
                f"column {key!r} is declared {kind} ({example}), but has the value {value!r}"
            )
        return typed
    if kind == "str":
        return str(value).strip() if not isinstance(value, float) else repr(value)
    try:
        number = float(str(value).strip())
        if not math.isfinite(number):
            raise ValueError
        if kind == "int":
            if not number.is_integer():
                raise ValueError
            return int(number)
        return number
    except ValueError:
        raise FilterError(
            f"column {key!r} is declared {kind}, but has the value {value!r}"
        ) from None
