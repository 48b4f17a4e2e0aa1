"""The one search of a gallery (:func:`search`) and its one answer shape (:class:`Neighbour`):
the CLI (``search --json``, the ``--queries`` lines), the REST API, the page and the Python API
all search through here, and check ``k`` with :func:`check_k`.

A neighbour as JSON is ``{"id", "path", "label", "class_name", "distance", "meta"}``, nearest first;
``meta`` holds the item's extra columns (empty when it has none). Queries are vectors: an
uploaded image embedded by the gallery's model, a gallery item's stored embedding
(:func:`item_vector`), or a vector a caller brings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.core import Gallery
from nearsight.index.rerank.spec import RerankSpec, parse_rerank
from nearsight.index.search.filters import Condition, merge_conditions, parse_filters


def item_vector(gallery: Gallery, item_id: int) -> np.ndarray:
    """The stored embedding [1, D] of gallery item ``item_id`` (a one-line error if absent)."""
    row = int(np.searchsorted(gallery.ids, item_id))
    if row >= len(gallery.ids) or int(gallery.ids[row]) != int(item_id):
        raise NearsightError(f"gallery {gallery.path} has no item with id {item_id}")
    return gallery.vectors_of([item_id])


def check_vector(gallery: Gallery, vector: Any) -> np.ndarray:
    """A caller's query vector(s) as float32 [Q, D], unit length; one-line error otherwise."""
    try:
        array = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        raise NearsightError("a query vector must be a list of numbers") from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != gallery.dim:
        raise NearsightError(
            f"a query vector must have {gallery.dim} numbers (the gallery's dim), got shape "
            f"{tuple(array.shape)}"
        )
    if not np.isfinite(array).all():
        raise NearsightError("a query vector must hold finite numbers")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise NearsightError("a query vector must not be all zeros")
    return np.ascontiguousarray(array / norms)  # the gallery compares directions


def allowed_ids(
    gallery: Gallery,
    filters: Sequence[str | Condition] | str | None,
    max_conditions: int | None = None,
) -> np.ndarray | None:
    """Ids meeting every filter, or None when there is no filter (search everything).
    Repeated conditions count once; more than ``max_conditions`` distinct ones (default
    :data:`~nearsight.index.search.filters.MAX_FILTER_CONDITIONS`) is a FilterError."""
    if filters is None:
        return None
    if isinstance(filters, str):
        conditions = parse_filters(filters)
    else:
        conditions = [
            c for f in filters for c in ([f] if isinstance(f, Condition) else parse_filters(f))
        ]
    conditions = merge_conditions(conditions, max_conditions)
    if not conditions:
        return None
    return gallery.filter_ids(conditions)


@dataclass(frozen=True)
class Neighbour:
    """One found item: its rank (1 = nearest), catalog fields and distance (Euclidean between
    unit vectors; None where an approximate index found fewer than k)."""

    rank: int
    id: int
    path: str
    label: int | None
    class_name: str | None
    distance: float | None
    meta: dict[str, Any] = field(default_factory=dict)  # the item's extra columns

    def as_json(self) -> dict[str, Any]:
        """The answer shape of ``search --json``, REST and the page's /search API."""
        return {
            "id": self.id,
            "path": self.path,
            "label": self.label,
            "class_name": self.class_name,
            "distance": self.distance,
            "meta": dict(self.meta),
        }


def check_k(k: Any, max_k: int | None = None, name: str = "k") -> int:
    """``k`` as an int (a whole float such as a slider's 5.0 counts), else a one-line error."""
    bound = "of at least 1" if max_k is None else f"from 1 to {max_k}"
    message = f"{name} must be an integer {bound}, got {k!r}"
    if isinstance(k, bool) or not isinstance(k, int | float | np.integer | np.floating):
        raise NearsightError(message)
    if not math.isfinite(k) or k != int(k) or k < 1 or (max_k is not None and k > max_k):
        raise NearsightError(message)
    return int(k)


def search(
    gallery: Gallery,
    vectors: np.ndarray,
    k: int,
    *,
    filters: Sequence[str | Condition] | str | None = None,
    allowed: np.ndarray | None = None,
    rerank: RerankSpec | str | None = None,
    exclude: Sequence[int] | None = None,
    rows: Mapping[int, dict[str, Any]] | None = None,
    public_path: Callable[[str], str] = str,
) -> list[list[Neighbour]]:
    """The ``k`` nearest items of each query vector [Q, D], nearest first.
    ``filters`` (or ``allowed``, already resolved ids): search only the matching items.
    ``rerank``: a re-ranking spec (nearsight.index.rerank); None: the gallery's stored one.
    ``exclude``: one item id per query to leave out (a gallery item querying the others).
    ``rows``: the catalog rows by id when the caller holds them (else read from SQLite);
    ``public_path``: how a path is shown to the caller."""
    k = check_k(k)
    if allowed is None:
        allowed = allowed_ids(gallery, filters)
    spec = resolve_rerank(gallery, rerank)
    distances, ids = gallery.search(vectors, k, ids=allowed, rerank=spec, exclude=exclude)
    per_query = [
        [(int(i), float(d)) for i, d in zip(ids[q], distances[q], strict=True) if i >= 0]
        for q in range(len(ids))
    ]
    if rows is None:
        wanted = sorted({i for found in per_query for i, _ in found})
        rows = {row["id"]: row for row in gallery.items(wanted)} if wanted else {}
    return [
        [_neighbour(rank, rows[i], d, public_path) for rank, (i, d) in enumerate(found, 1)]
        for found in per_query
    ]


def _neighbour(
    rank: int, item: Mapping[str, Any], distance: float, public_path: Callable[[str], str]
) -> Neighbour:
    return Neighbour(
        rank=rank,
        id=int(item["id"]),
        path=public_path(str(item["path"])),
        label=None if item["label"] is None else int(item["label"]),
        class_name=item["class_name"],
        distance=distance if math.isfinite(distance) else None,
        meta=dict(item.get("meta") or {}),
    )


def resolve_rerank(gallery: Gallery, rerank: RerankSpec | str | None) -> RerankSpec:
    """``rerank`` parsed (one-line NearsightError when bad); None: the gallery's default."""
    if rerank is None:
        return gallery.default_rerank
    try:
        return parse_rerank(rerank)
    except ValueError as error:
        raise NearsightError(str(error)) from None


def item_row(item: dict[str, Any]) -> dict[str, Any]:
    """A catalog row as JSON (``GET /api/items/{id}``)."""
    return {
        key: item.get(key)
        for key in ("id", "path", "label", "class_name", "split", "sha256", "width", "height")
    } | {"meta": dict(item.get("meta") or {})}
