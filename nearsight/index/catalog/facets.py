"""Facets: what the items a filter allows hold, column by column, read from the payload index
(nearsight/index/catalog/payload_index.py). A text column gives its most frequent values with
exact counts; a number or date column its range and a histogram; each column how many of the
allowed items have no value.

The allowed ids become one bitmap over the id span, and each column part's ids (ordered by
value) are looked up in it once: a text value's count is the number of its ids inside, a
prefix-sum difference over the part's value order, so every value is counted exactly without
a set per value.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from nearsight.data.meta import DATE_TYPES
from nearsight.index.catalog.columns import Part, Snapshot
from nearsight.index.catalog.payload_index import PayloadIndex

TOP_VALUES = 10  # values listed per text column
BINS = 10  # histogram bins per number or date column
TEXT_BUILTINS = ("class_name", "split")  # built-in columns faceted beside the metadata


@dataclass
class ColumnFacet:
    """One column over the allowed items: ``values`` (text: [value, count], most frequent
    first, ties by value) or ``low``/``high``/``histogram`` (numbers, dates: [bin start, bin
    end, count]; a bin holds its start and not its end, the last bin both)."""

    key: str
    type: str
    missing: int  # allowed items without a value
    values: list[tuple[str, int]] = field(default_factory=list)
    distinct: int = 0  # distinct values among the allowed items (text)
    low: float | str | None = None
    high: float | str | None = None
    histogram: list[tuple[float | str, float | str, int]] = field(default_factory=list)

    def as_dict(self) -> dict:
        out: dict = {"key": self.key, "type": self.type, "missing": self.missing}
        if self.type in ("int", "float", *DATE_TYPES):
            out.update(low=self.low, high=self.high,
                       histogram=[{"low": a, "high": b, "count": c} for a, b, c in self.histogram])  # fmt: skip
        else:
            out.update(distinct=self.distinct,
                       values=[{"value": v, "count": c} for v, c in self.values])  # fmt: skip
        return out


@dataclass
class Facets:
    """The facets of the items a filter allows (``items``: how many)."""

    items: int
    columns: list[ColumnFacet]
    notes: list[str] = field(default_factory=list)  # on filter values no item holds

    def as_dict(self) -> dict:
        return {"items": self.items, "columns": [column.as_dict() for column in self.columns],
                "notes": list(self.notes)}  # fmt: skip


def column_facets(
    payload: PayloadIndex,
    allowed: np.ndarray | None,
    column_types: dict[str, str],
    top: int = TOP_VALUES,
    bins: int = BINS,
) -> Facets:
    """The facets of ``allowed`` (sorted ids; None: every live item) for each metadata column
    of ``column_types`` and the built-in text columns."""
    ids = payload.live_ids() if allowed is None else np.asarray(allowed, np.int64)
    keys = [key for key in TEXT_BUILTINS if key in payload.keys and payload.holds_any(key)]
    keys += [key for key in payload.meta_keys() if key in column_types]
    hits = [(snapshot, _inside(snapshot, ids)) for snapshot in payload.snapshots()]
    columns = []
    for key in keys:
        kind = column_types.get(key, "str")
        texts: Counter[str] = Counter()
        numbers: list[np.ndarray] = []
        having = 0
        for snapshot, inside in hits:
            if inside is None:
                continue
            column = snapshot.columns[key]
            listed = 0  # allowed ids listed in the parts: an id once, but for a tag column
            for storage, part in column.parts.items():
                hit = inside(np.asarray(part.ids))
                listed += int(np.count_nonzero(hit))
                if storage == "text":
                    texts.update(_text_counts(part, hit))
                else:
                    numbers.append(np.asarray(part.values)[hit])
            once = sum(len(part.ids) for part in column.parts.values()) == len(column.has)
            having += listed if once else int(np.count_nonzero(inside(np.asarray(column.has))))
        facet = ColumnFacet(key, kind, missing=len(ids) - having)
        if kind in DATE_TYPES:
            _date_range(facet, texts, bins)
        elif kind in ("int", "float"):
            _number_range(facet, numbers, bins)
        else:
            texts.update(str(v) for part in numbers for v in part.tolist())  # numbers in text
            ranked = sorted(texts.items(), key=lambda item: (-item[1], item[0]))
            facet.values, facet.distinct = ranked[:top], len(ranked)
        columns.append(facet)
    return Facets(len(ids), columns)


def _inside(snapshot: Snapshot, ids: np.ndarray):
    """A lookup ``ids of the snapshot -> which are allowed`` (one bitmap), or None (no
    allowed id falls in the snapshot)."""
    all_ids = np.asarray(snapshot.all_ids)
    if not len(all_ids) or not len(ids):
        return None
    low, high = int(all_ids[0]), int(all_ids[-1])
    mine = ids[(ids >= low) & (ids <= high)]
    if not len(mine):
        return None
    bitmap = np.zeros(high - low + 1, dtype=bool)
    bitmap[mine - low] = True
    return lambda part_ids: bitmap[part_ids - low] if len(part_ids) else np.zeros(0, bool)


def _text_counts(part: Part, hit: np.ndarray) -> dict[str, int]:
    """Each text value's count of allowed ids (``hit``: which of the part's ids are)."""
    assert part.starts is not None
    starts = np.asarray(part.starts)
    kind = np.int32 if len(hit) < 2**31 else np.int64
    before = np.concatenate([np.zeros(1, kind), np.cumsum(hit, dtype=kind)])
    counts = before[starts[1:]] - before[starts[:-1]]
    held = np.flatnonzero(counts)
    values = part.text()
    return {values[i].decode("utf-8", "surrogatepass"): int(counts[i]) for i in held}


def _number_range(facet: ColumnFacet, numbers: list[np.ndarray], bins: int) -> None:
    values = np.concatenate([np.zeros(0), *(part.astype(np.float64) for part in numbers)])
    if not len(values):
        return
    low, high = float(values.min()), float(values.max())
    if facet.type == "int":  # whole numbers: bins of whole widths, the last holding ``high``
        count = min(bins, int(high - low) + 1)
        edges = np.linspace(low, high + 1, count + 1)
        counts, edges = np.histogram(values, bins=edges)
        facet.low, facet.high = int(low), int(high)
    else:
        span = (low, high) if high > low else (low - 0.5, low + 0.5)
        counts, edges = np.histogram(values, bins=bins if high > low else 1, range=span)
        facet.low, facet.high = low, high
    facet.histogram = [(float(a), float(b), int(c)) for a, b, c in
                       zip(edges[:-1], edges[1:], counts, strict=True)]  # fmt: skip


def _date_range(facet: ColumnFacet, texts: Counter[str], bins: int) -> None:
    """Dates (ISO text) as a range and a histogram of equal spans of time."""
    if not texts:
        return
    values = sorted(texts)
    stamps = np.array([np.datetime64(v, "s").astype(np.int64) for v in values], np.float64)
    weights = np.array([texts[v] for v in values])
    facet.low, facet.high = values[0], values[-1]
    low, high = stamps[0], stamps[-1]
    if high == low:
        facet.histogram = [(values[0], values[-1], int(weights.sum()))]
        return
    counts, edges = np.histogram(stamps, bins=bins, range=(low, high), weights=weights)
    unit = "D" if facet.type == "date" else "s"
    shown = [str(np.datetime64(int(edge), "s").astype(f"datetime64[{unit}]")) for edge in edges]
    facet.histogram = [
        (a, b, int(c)) for a, b, c in zip(shown[:-1], shown[1:], counts, strict=True)
    ]
