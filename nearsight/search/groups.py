"""A search grouped by a column (a product's SKU: one answer per product, not per photo), as
Qdrant's ``group_by`` and Elasticsearch's collapse answer.

A grouped search is the route's one ranking (filters and re-ranking included) grouped by the
value each item holds in the column: the groups in the order of their best item, each with its
best ``group_size`` items in ranking order, ``k`` groups from ``offset`` on. Items without a
value in the column are left out. The ranking is read deeper and deeper until the groups asked
for are complete (each holds ``group_size`` items, or every allowed item of its value) or every
allowed item is ranked (at most :data:`MAX_DEPTH`), so on a flat gallery the answer equals
grouping the exact ranking of all the allowed items. Each hit keeps its rank in that ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError, closest_names
from nearsight.data.meta import MetaValue
from nearsight.index.catalog.filters import Condition
from nearsight.index.catalog.list_columns import gallery_list_columns
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.keys import key_column
from nearsight.search import route
from nearsight.search.neighbour import Neighbour, neighbour
from nearsight.search.rerank.rerankers import Reranker
from nearsight.search.rerank.spec import RerankSpec

GROUP_COLUMN_META = "group_column"  # the catalog meta key of a gallery's default group column
ROW_COLUMNS = ("label", "class_name", "split")  # columns of the row itself, not of its meta
FIRST_DEPTH = 64  # the first ranking read; each further one is four times deeper
MAX_DEPTH = 65_536  # the deepest ranking read: past it, the groups found so far are the answer


@dataclass(frozen=True)
class Group:
    """One value of the group column and its best hits (nearest first)."""

    value: MetaValue
    count: int  # the items the filters allow that hold this value
    neighbours: tuple[Neighbour, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "count": self.count,
            "neighbours": [hit.as_json() for hit in self.neighbours],
        }


def default_group_column(gallery: Gallery) -> str | None:
    """The group column the gallery records (``--group-column`` at build or import), if any."""
    return gallery.meta.get(GROUP_COLUMN_META) or None


def check_group_column(gallery: Gallery, column: Any) -> str:
    """``column`` as a column the gallery's items hold (a metadata column, or label,
    class_name, split); a one-line NearsightError naming the close ones otherwise."""
    if not isinstance(column, str) or not column.strip():
        raise NearsightError(f"group_by must name a column, got {column!r}")
    known = [*gallery.meta_keys(), *ROW_COLUMNS]
    if column not in known:
        raise NearsightError(
            f"group_by {column[:100]!r}: the gallery has no such column; "
            f"{closest_names(column, known)}"
        )
    if column in gallery_list_columns(gallery.meta):
        raise NearsightError(
            f"group_by {column!r} is a tag column, whose items each hold several values: "
            "group by a column of one value an item (a product id)"
        )
    return column


def check_group_size(size: Any, most: int | None = None) -> int:
    """Hits per group: a whole number of at least 1 (and at most ``most``)."""
    span = "of at least 1" if most is None else f"from 1 to {most}"
    try:
        value = int(size)
        whole = not isinstance(size, bool) and float(size) == value
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < 1 or (most is not None and value > most):
        raise NearsightError(f"group_size must be a whole number {span}, got {size!r}")
    return value


def value_of(row: Mapping[str, Any], column: str) -> MetaValue | None:
    """The value an item's catalog row holds in ``column`` (None: none)."""
    value = row.get(column) if column in ROW_COLUMNS else (row.get("meta") or {}).get(column)
    return None if value is None or value == "" else value


def search_groups(
    gallery: Gallery,
    vectors: np.ndarray,
    k: int,
    *,
    group_by: str,
    group_size: int = 1,
    offset: int = 0,
    allowed: np.ndarray | None = None,
    rerank: RerankSpec | Reranker,
    self_ids: Sequence[int | None] | None = None,
    exclude: Sequence[int] | np.ndarray | None = None,
    query_side: np.ndarray | None = None,
    rows: Mapping[int, dict[str, Any]] | None = None,
    shown_path: Callable[[Mapping[str, Any]], str] | None = None,
    notes: list[str] | None = None,
) -> list[list[Group]]:
    """Per query, groups ``offset + 1`` to ``offset + k`` of its ranking grouped by the column
    ``group_by`` (module docstring); the other arguments as :func:`route.search`'s."""
    total = len(gallery) if allowed is None else len(allowed)
    need = offset + k
    depth = min(total, MAX_DEPTH, max(FIRST_DEPTH, 4 * need * group_size))
    counts: dict[MetaValue, int] = {}

    def count(value: MetaValue) -> int:  # the allowed items holding ``value``, read once
        if value not in counts:
            holding = gallery.filter_ids([Condition(group_by, "=", value)])
            if allowed is not None:
                holding = np.intersect1d(holding, allowed, assume_unique=True)
            counts[value] = len(holding)
        return counts[value]

    while True:
        said: list[str] = []  # what the route says of the last ranking read
        ranked = route.ranking(gallery, vectors, max(depth, 1), allowed=allowed, rerank=rerank,
                               self_ids=self_ids, exclude=exclude, query_side=query_side,
                               notes=said)  # fmt: skip
        held = _rows(gallery, ranked, rows)
        grouped = [_grouped(ids, held, group_by) for ids, _ in ranked]
        if depth >= min(total, MAX_DEPTH) or all(
            _complete(g, need, group_size, count) for g in grouped
        ):
            break
        depth = min(total, MAX_DEPTH, depth * 4)
    if notes is not None:
        notes.extend(note for note in said if note not in notes)
    column, tags = key_column(gallery), gallery_list_columns(gallery.meta)
    show = shown_path or (lambda row: str(row["path"]))
    answer = []
    for (_, distances), groups in zip(ranked, grouped, strict=True):
        answer.append(
            [
                Group(
                    value=value,
                    count=count(value),
                    neighbours=tuple(
                        neighbour(
                            at + 1, held[i], float(distances[at]), show(held[i]), column, tags
                        )
                        for at, i in hits[:group_size]
                    ),
                )
                for value, hits in list(groups.items())[offset:need]
            ]
        )
    return answer


def _rows(
    gallery: Gallery, ranked: Sequence[route.Ranking], rows: Mapping[int, dict[str, Any]] | None
) -> Mapping[int, dict[str, Any]]:
    if rows is not None:
        return rows
    wanted = sorted({i for ids, _ in ranked for i in ids})
    return {row["id"]: row for row in gallery.items(wanted)} if wanted else {}


def _grouped(
    ids: Sequence[int], rows: Mapping[int, dict[str, Any]], column: str
) -> dict[MetaValue, list[tuple[int, int]]]:
    """value -> its (position in the ranking, id) pairs, values in order of first sight."""
    groups: dict[MetaValue, list[tuple[int, int]]] = {}
    for at, item in enumerate(ids):
        value = value_of(rows[item], column)
        if value is not None:
            groups.setdefault(value, []).append((at, item))
    return groups


def _complete(
    groups: dict[MetaValue, list[tuple[int, int]]],
    need: int,
    size: int,
    count: Callable[[MetaValue], int],
) -> bool:
    """Whether the first ``need`` groups are settled: that many seen, each full (``size``
    hits, or every allowed item of its value)."""
    if len(groups) < need:
        return False
    firsts = list(groups.items())[:need]
    return all(len(hits) >= size or len(hits) >= count(value) for value, hits in firsts)
