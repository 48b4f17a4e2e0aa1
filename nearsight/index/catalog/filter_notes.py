"""Notes on filters that match nothing for a reason a person can fix: ``shop=cafe`` where the
shop is ``Café``, ``sku=123`` where the SKU is ``00123``. A filter whose text value no item
holds gets a note naming the closest values its column does hold; the search still runs as
asked (an empty answer is a true answer), and each route shows the note its own way (the CLI
on stderr, REST in ``notes``, the page as a message, Python as a warning).

Closeness is judged on a folded form of each value (case, accents and surrounding zeros
ignored) by difflib's ratio, as :func:`nearsight.core.errors.closest_names` does for names.
"""

from __future__ import annotations

import difflib
import sqlite3
import unicodedata
from collections.abc import Callable, Collection, Sequence

from nearsight.data.meta import _short
from nearsight.index.catalog.filters import FILTERABLE_BUILTINS, Condition

MOST = 3  # values named in one note
MAX_VALUES = 100_000  # distinct values of a column looked at for a note


def fold(text: str) -> str:
    """``text`` without case, accents or leading zeros, for judging closeness."""
    plain = unicodedata.normalize("NFKD", text.casefold())
    plain = "".join(c for c in plain if not unicodedata.combining(c))
    return plain.strip().lstrip("0") or plain.strip()


def closest_values(value: str, held: Sequence[str], most: int = MOST) -> list[str]:
    """The values among ``held`` closest to ``value`` (same folded form first)."""
    wanted = fold(value)
    by_fold: dict[str, list[str]] = {}
    for one in held:
        by_fold.setdefault(fold(one), []).append(one)
    same = by_fold.get(wanted, [])
    close = difflib.get_close_matches(wanted, list(by_fold), n=most, cutoff=0.6)
    found = [*same, *(v for f in close if f != wanted for v in by_fold[f])]
    return list(dict.fromkeys(found))[:most]


def value_notes(
    conn: sqlite3.Connection,
    typed: Sequence[Condition],
    column_types: dict[str, str],
    list_keys: Collection[str] = (),
) -> list[str]:
    """One note per ``=``/``!=`` condition on a text metadata column whose value no item has
    (``typed``: conditions typed by their columns; ``list_keys``: the tag columns, whose
    stored text is the tags joined by ``|``), read by SQL."""

    def holds(key: str, value: str) -> bool:
        test = (
            "instr('|' || value || '|', '|' || ? || '|') > 0" if key in list_keys else "value = ?"
        )
        return conn.execute(f"SELECT 1 FROM item_meta WHERE key = ? AND {test} LIMIT 1",
                            (key, value)).fetchone() is not None  # fmt: skip

    def values(key: str) -> list[str]:
        found = [str(row[0]) for row in conn.execute(
            "SELECT DISTINCT value FROM item_meta WHERE key = ? LIMIT ?", (key, MAX_VALUES))]  # fmt: skip
        if key in list_keys:
            found = sorted({tag for text in found for tag in text.split("|")})
        return found

    return notes_on(typed, column_types, holds, values)


def notes_on(
    typed: Sequence[Condition],
    column_types: dict[str, str],
    holds: Callable[[str, str], bool],
    held_values: Callable[[str], list[str]],
) -> list[str]:
    """:func:`value_notes` given ``holds(key, value)`` (whether some item has it) and
    ``held_values(key)`` (the column's distinct values), from SQL or from the payload index."""
    notes = []
    for condition in typed:
        if (
            condition.op not in ("=", "!=")
            or condition.value is None
            or condition.key in FILTERABLE_BUILTINS
            or column_types.get(condition.key) != "str"
        ):
            continue
        for one in condition.values:  # each value of an any-of gets its own note
            key, value = condition.key, str(one)
            if holds(key, value):
                continue
            values = held_values(key)
            close = closest_values(value, values)
            if close:
                hint = "the closest values it holds: " + ", ".join(repr(_short(v)) for v in close)
            elif values:
                hint = "it holds e.g. " + ", ".join(repr(_short(v)) for v in sorted(values)[:MOST])
            else:
                hint = "no item has a value for it"
            notes.append(f"{_short(str(condition))}: no item has {key} {_short(value)!r}; {hint}")
    return notes
