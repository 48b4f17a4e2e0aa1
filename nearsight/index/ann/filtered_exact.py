"""The exact way of a filtered search (nearsight.index.ann.filtered): the inner products of the
queries with the allowed items' vectors only, read in place where they are rows of one array."""

from __future__ import annotations

from collections.abc import Callable

import faiss
import numpy as np

__all__ = ["RowsOf", "VectorsOf", "complete_rows", "exact_search", "rows_in"]

VectorsOf = Callable[[np.ndarray], np.ndarray]
# (matrix, row positions) of the given sorted ids when they are rows of one float32 array
RowsOf = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray] | None]


def exact_search(
    queries: np.ndarray,
    vectors_of: VectorsOf,
    allowed: np.ndarray,
    depth: int,
    rows_of: RowsOf | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(inner products, ids) [Q, depth] of an exact search over the allowed items only: on
    their stored rows in place where ``rows_of`` finds them all in one array, else over a
    gathered copy (``vectors_of(ids)``, Gallery.vectors_of)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    held = rows_of(allowed) if rows_of is not None and len(queries) < 16 else None
    if held is None:
        vectors = np.ascontiguousarray(vectors_of(allowed), dtype=np.float32)
        inner, positions = faiss.knn(queries, vectors, depth, metric=faiss.METRIC_INNER_PRODUCT)
        ids = np.where(positions >= 0, allowed[np.maximum(positions, 0)], -1)
        return inner, ids.astype(np.int64)
    matrix, positions = held
    count, dim = matrix.shape
    inner = np.empty((len(queries), depth), np.float32)
    rows = np.empty((len(queries), depth), np.int64)
    for q in range(len(queries)):
        # in faiss's SWIG module, missing from its stubs
        faiss.knn_inner_products_by_idx(  # type: ignore[attr-defined]
            faiss.swig_ptr(queries[q]), faiss.swig_ptr(matrix), faiss.swig_ptr(positions),
            dim, 1, count, len(positions), depth, faiss.swig_ptr(inner[q]),
            faiss.swig_ptr(rows[q]), len(positions),
        )  # fmt: skip
    # positions rise with the ids (both sorted): each row's position names its id
    ids = allowed[np.clip(np.searchsorted(positions, rows), 0, len(allowed) - 1)]
    return inner, np.where(rows >= 0, ids, -1)


def rows_in(
    base_ids: np.ndarray, rows: np.ndarray | None, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """(``rows``, the positions of ``ids`` in it) when every one of the sorted ``ids`` is one
    of ``base_ids`` (sorted; row i of ``rows`` is ``base_ids[i]``), else None (some were added
    since, in segments, or there are no stored rows: exact_search gathers a copy)."""
    if rows is None or not len(ids) or not len(base_ids):
        return None
    if base_ids[0] == 0 and base_ids[-1] == len(base_ids) - 1:  # ids 0..N-1: no search
        return (rows, ids) if ids[0] >= 0 and ids[-1] < len(base_ids) else None
    position = np.minimum(np.searchsorted(base_ids, ids), len(base_ids) - 1)
    if not (base_ids[position] == ids).all():
        return None
    return rows, position


def complete_rows(
    found_inner: np.ndarray,
    found_ids: np.ndarray,
    queries: np.ndarray,
    vectors_of: VectorsOf,
    allowed: np.ndarray,
    rows_of: RowsOf | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Re-search exactly the queries whose approximate filtered search came back short."""
    short = (found_ids < 0).any(axis=1)
    if short.any():
        depth = found_ids.shape[1]
        inner, ids = exact_search(queries[short], vectors_of, allowed, depth, rows_of)
        found_inner, found_ids = found_inner.copy(), found_ids.copy()
        found_inner[short], found_ids[short] = inner, ids
    return found_inner, found_ids
