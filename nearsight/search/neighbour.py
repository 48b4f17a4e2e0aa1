"""The one result type: a :class:`Neighbour`, from the search route to every surface (the
CLI's ``--json``, REST, the page and the Python API).

A neighbour is an item of the gallery found for a query: its rank (1 first), id, key (the
gallery's key column, when it has one), path as shown to whoever asked, label, class name,
distance and metadata (a tag column's value as its list of tags). The distance is the exact
Euclidean distance between the query's unit vector and the item's stored one (0 to 2), whatever
index or re-ranking found the item; a gallery item searched by its id is its own first
neighbour at distance exactly 0.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nearsight.data.meta import AnswerValue
from nearsight.index.catalog.list_columns import listed_tags


@dataclass(frozen=True)
class Neighbour:
    """One gallery item found for a query (module docstring).

    Fields read as attributes (``n.id``) or, for code written against the earlier dict rows,
    by name (``n["id"]``, ``n.get("meta")``)."""

    rank: int
    id: int
    key: str | None
    path: str  # as shown: the full path locally, a gallery-relative name on a server
    label: int | None
    class_name: str | None
    distance: float | None  # None only where an approximate index found fewer than asked
    meta: Mapping[str, AnswerValue] = field(default_factory=dict)  # a tag column's: a list

    def as_json(self) -> dict[str, Any]:
        """The JSON object of this neighbour: every field, in order."""
        return {
            name: (dict(self.meta) if name == "meta" else getattr(self, name)) for name in FIELDS
        }

    def __getitem__(self, name: str) -> Any:
        if name not in FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in FIELDS else default

    def keys(self) -> tuple[str, ...]:
        return FIELDS

    def __iter__(self) -> Iterator[str]:  # dict(neighbour) gives the JSON object
        return iter(FIELDS)


# the JSON keys, in order: `nearsight search --json`, REST's "neighbours", `to_pandas()`
FIELDS = tuple(f.name for f in fields(Neighbour))


def neighbour(
    rank: int,
    row: Mapping[str, Any],
    distance: float,
    path: str,
    key_column: str | None,
    tag_columns: Collection[str] = (),
) -> Neighbour:
    """A catalog ``row`` found at ``distance`` as the ``rank``-th neighbour, shown as ``path``;
    a value of ``tag_columns`` as its list of tags."""
    meta = listed_tags(row.get("meta") or {}, tag_columns)
    key = meta.get(key_column) if key_column else None
    return Neighbour(
        rank=rank,
        id=int(row["id"]),
        key=None if key is None else str(key),
        path=path,
        label=None if row.get("label") is None else int(row["label"]),
        class_name=row.get("class_name"),
        distance=float(distance) if math.isfinite(distance) else None,
        meta=meta,
    )
