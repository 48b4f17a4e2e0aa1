"""Random catalogs with mixed-type columns, and random filter conditions on them: what the
filter engines (SQL, the column arrays, the payload index) are compared on."""

from __future__ import annotations

import sqlite3

import numpy as np

from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.filters import Condition

OPS = ("=", "!=", "<", "<=", ">", ">=")
BIG = 2**62
WORDS = ("", "a", "ab", "b", "B", "café", "cafe", "Ä", "z", "2025-06-01", "2025-06-01T10:00:00",
         "10", "9", "日本", "a b", "ab\u0301")  # fmt: skip


def value_of(rng: np.random.Generator, kind: str):
    """A value of ``kind``: integers and reals near each other (and near 2**53, 2**62), text
    with accents, case, digits and dates."""
    if kind == "int":
        return int(rng.choice([rng.integers(-5, 6), 2**53 + rng.integers(-2, 3),
                               BIG + rng.integers(-2, 3), -BIG]))  # fmt: skip
    if kind == "float":
        return float(rng.choice([rng.integers(-5, 6) / 2, 2.0**53, float(2**53 + 1), 1e300,
                                 float(BIG), -0.0, float("inf"), 0.1]))  # fmt: skip
    return str(rng.choice(WORDS))


def random_catalog(path, rng: np.random.Generator, count: int) -> None:
    """Items with built-in columns (some missing) and columns ``n`` (numbers, int and real
    mixed), ``t`` (text, a few numbers), ``m`` (all three kinds); every column missing for
    some items; ids with gaps; a few metadata rows of items the catalog lacks."""
    items = []
    for i in range(count):
        meta = {}
        if rng.random() < 0.8:
            meta["n"] = value_of(rng, "int" if rng.random() < 0.5 else "float")
        if rng.random() < 0.8:
            meta["t"] = value_of(rng, "str" if rng.random() < 0.9 else "int")
        if rng.random() < 0.7:
            meta["m"] = value_of(rng, str(rng.choice(["int", "float", "str"])))
        meta = {k: v for k, v in meta.items() if v != "" and v != float("inf")}
        items.append({
            "id": int(i * 3 + rng.integers(0, 3)),
            "path": f"{i}.jpg",
            "label": None if rng.random() < 0.1 else int(rng.integers(0, 5)),
            "class_name": None if rng.random() < 0.1 else str(rng.choice(["cat", "dog", "Cat"])),
            "split": str(rng.choice(["train", "test"])),
            "width": None if rng.random() < 0.2 else int(rng.integers(1, 4)),
            "meta": meta,
        })  # fmt: skip
    create_catalog(path, items, {"dim": 4})
    with sqlite3.connect(path) as conn:  # values create_catalog would not write
        conn.execute("INSERT INTO item_meta VALUES (?, 'n', ?)", (10**9, 1))  # no such item
        conn.execute(
            "UPDATE item_meta SET value = ? WHERE key = 'm' AND item_id IN "
            "(SELECT item_id FROM item_meta WHERE key = 'm' LIMIT 3)",
            (float("inf"),),
        )
        conn.execute("UPDATE items SET width = 2.5 WHERE id % 7 = 0")  # fmt: skip
    conn.close()


def conditions(rng: np.random.Generator) -> list[Condition]:
    """One to three conditions of any kind, typed as the gallery would type them or not
    (a text value on a number column: the SQL answers that too); some ``=``/``!=`` name
    several values (any of)."""
    out = []
    for _ in range(int(rng.integers(1, 4))):
        key = str(rng.choice(["n", "t", "m", "label", "class_name", "split", "width", "id"]))
        op = str(rng.choice(OPS))
        if rng.random() < 0.1 and op in ("=", "!="):
            value = None
        else:
            if key in ("class_name", "split"):
                op = op if op in ("=", "!=") else "="
            value = _value(rng, key)
            if op in ("=", "!=") and rng.random() < 0.3:  # any of two or three values
                more = [_value(rng, key) for _ in range(int(rng.integers(1, 3)))]
                value = tuple(dict.fromkeys([value, *more]))
        out.append(Condition(key, op, value))
    return out


def _value(rng: np.random.Generator, key: str):
    if key in ("class_name", "split"):
        return str(rng.choice(["cat", "dog", "Cat", "train", "x"]))
    if key in ("label", "width", "id"):
        value = value_of(rng, "int") if rng.random() < 0.3 else int(rng.integers(-1, 8))
        return value + 0.5 if rng.random() < 0.2 else value
    return value_of(rng, str(rng.choice(["int", "float", "str"])))
