"""Search restricted to a set of ids, inside FAISS: an ``IDSelectorBatch`` in the search
parameters, so every index type skips the other items while it searches (not a post-filter
that would leave fewer than k).

- flat: the selector makes the exact scan skip the other vectors: the true top-k of the
  allowed items, always k of them when k are allowed.
- ivf: ``SearchParametersIVF(sel, nprobe)``: the probed lists are scanned for allowed ids
  only. A narrow filter can leave fewer than k allowed items in the probed lists.
- hnsw: ``SearchParametersHNSW(sel, efSearch)``: the graph walk visits every node but keeps
  only allowed ones, so with a narrow filter the candidate list may run dry before k.

For ivf and hnsw a query that found fewer than min(k, allowed) items is searched again
exactly over the allowed items' stored vectors (what clip-retrieval and autofaiss do for a
filter that an approximate index cannot honour), so a filtered search returns k items
whenever k match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import faiss
import numpy as np

HNSW_FILTER_EF_FACTOR = 4  # a filtered HNSW walk keeps more candidates: many are rejected
HNSW_FILTER_MIN_EF = 128  # and at least this many (a tuned efSearch may be as low as 16)


def search_parameters(
    index_type: str, allowed: np.ndarray, meta: dict[str, Any], depth: int
) -> faiss.SearchParameters:
    """Search parameters whose selector admits only ``allowed`` (sorted int64 ids)."""
    selector = faiss.IDSelectorBatch(allowed)
    if index_type == "ivf":
        params = faiss.SearchParametersIVF(sel=selector, nprobe=int(meta.get("nprobe", 8)))
    elif index_type == "hnsw":
        ef = int(meta.get("ef_search", 64)) * HNSW_FILTER_EF_FACTOR
        ef = max(ef, HNSW_FILTER_MIN_EF, depth)
        params = faiss.SearchParametersHNSW(sel=selector, efSearch=ef)
    else:
        params = faiss.SearchParameters(sel=selector)
    params.referenced_objects = [selector]  # the C++ side holds a bare pointer
    return params


def exact_search(
    queries: np.ndarray,
    vectors_of: Callable[[np.ndarray], np.ndarray],
    allowed: np.ndarray,
    depth: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(inner products, ids) [Q, depth] of an exact search over the allowed items only;
    ``vectors_of(ids)`` gives their vectors (Gallery.vectors_of)."""
    vectors = np.ascontiguousarray(vectors_of(allowed), dtype=np.float32)
    inner, positions = faiss.knn(queries, vectors, depth, metric=faiss.METRIC_INNER_PRODUCT)
    ids = np.where(positions >= 0, allowed[np.maximum(positions, 0)], -1)
    return inner, ids.astype(np.int64)


def complete_rows(
    found_inner: np.ndarray,
    found_ids: np.ndarray,
    queries: np.ndarray,
    vectors_of: Callable[[np.ndarray], np.ndarray],
    allowed: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Re-search exactly the queries whose approximate filtered search came back short."""
    short = (found_ids < 0).any(axis=1)
    if short.any():
        depth = found_ids.shape[1]
        inner, ids = exact_search(queries[short], vectors_of, allowed, depth)
        found_inner, found_ids = found_inner.copy(), found_ids.copy()
        found_inner[short], found_ids[short] = inner, ids
    return found_inner, found_ids
