"""Neighbours as JSON-ready rows: the one answer shape of the CLI (``search --json``, the
``--queries`` lines), the REST API and the Python API.

A neighbour is ``{"id", "path", "label", "class_name", "distance", "meta"}``, nearest first;
``meta`` holds the item's extra columns (empty when it has none). Queries are vectors: an
uploaded image embedded by the gallery's model, a gallery item's stored embedding
(:func:`item_vector`), or a vector a caller brings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.filters import Condition, merge_conditions, parse_filters
from nearsight.index.gallery.core import Gallery
from nearsight.search.checks import check_k
from nearsight.search.rerank.search import reranked_search
from nearsight.search.rerank.spec import RerankSpec, parse_rerank


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
    :data:`~nearsight.index.catalog.filters.MAX_FILTER_CONDITIONS`) is a FilterError."""
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


def search_rows(
    gallery: Gallery,
    vectors: np.ndarray,
    k: Any,
    *,
    filters: Sequence[str | Condition] | str | None = None,
    allowed: np.ndarray | None = None,
    rerank: RerankSpec | str | None = None,
    exclude: Sequence[int] | np.ndarray | None = None,
    rows: Mapping[int, dict[str, Any]] | None = None,
) -> list[list[dict[str, Any]]]:
    """The search every caller goes through (the CLI, REST, the page, the Python API): the
    ``k`` nearest items of each query vector, as JSON-ready rows (module docstring).
    ``filters`` (or ``allowed``, already resolved ids): search only the matching items.
    ``rerank``: a re-ranking spec (nearsight.search.rerank); None: the gallery's stored one.
    ``exclude``: per query, an item left out (a gallery item querying the others). ``rows``:
    the catalog rows by id where the caller holds them in memory (else they are read)."""
    k = check_k(k)
    if allowed is None:
        allowed = allowed_ids(gallery, filters)
    spec = resolve_rerank(gallery, rerank)
    if spec.active:
        distances, ids = reranked_search(gallery, vectors, k, spec, ids=allowed, exclude=exclude)
    else:
        distances, ids = gallery.search(vectors, k, ids=allowed, exclude=exclude)
    per_query = [
        [(int(i), float(d)) for i, d in zip(ids[q], distances[q], strict=True) if i >= 0]
        for q in range(len(ids))
    ]
    if rows is None:
        wanted = sorted({i for found in per_query for i, _ in found})
        rows = {row["id"]: row for row in gallery.items(wanted)} if wanted else {}
    return [[neighbour_row(rows[i], d) for i, d in found] for found in per_query]


def resolve_rerank(gallery: Gallery, rerank: RerankSpec | str | None) -> RerankSpec:
    """``rerank`` parsed (one-line NearsightError when bad); None: the gallery's default."""
    if rerank is None:
        return stored_rerank(gallery)
    try:
        return parse_rerank(rerank)
    except ValueError as error:
        raise NearsightError(str(error)) from None


def stored_rerank(gallery: Gallery) -> RerankSpec:
    """The re-ranking stored in the gallery (``nearsight eval --tune-on ... --save``), else
    none."""
    return parse_rerank(gallery.meta.get("rerank"))


def neighbour_row(item: dict[str, Any], distance: float) -> dict[str, Any]:
    """The one neighbour shape (module docstring); a distance an approximate index could not
    give (inf) is None."""
    return {
        "id": int(item["id"]),
        "path": item["path"],
        "label": item["label"],
        "class_name": item["class_name"],
        "distance": distance if math.isfinite(distance) else None,
        "meta": dict(item.get("meta") or {}),
    }


def item_row(item: dict[str, Any]) -> dict[str, Any]:
    """A catalog row as JSON (``GET /api/items/{id}``)."""
    return {
        key: item.get(key)
        for key in ("id", "path", "label", "class_name", "split", "sha256", "width", "height")
    } | {"meta": dict(item.get("meta") or {})}
