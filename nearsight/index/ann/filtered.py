"""Search restricted to a set of ids (a filter's matches), on every index type.

Two ways, chosen per search by how many items the filter allows:

- **few** (at most :func:`exact_limit`): an exact search over the allowed items' vectors
  alone (``faiss.knn`` over just those rows): the true top-k, and cheaper than walking an
  index in which the allowed items are scattered, or than a flat scan that checks every id
  against the filter (Weaviate's ``flatSearchCutoff`` and Qdrant's ``full_scan_threshold`` make
  the same switch).
- **more**: the index itself, with an ``IDSelectorBitmap`` in its search parameters, so that it
  skips the other items while it searches (not a post-filter that would leave fewer than k):

  - flat: the exact scan skips them: the true top-k of the allowed items;
  - ivf, ivfpq, opq: ``SearchParametersIVF(sel, nprobe)`` (opq: inside a
    ``SearchParametersPreTransform``, whose ``index_params`` reach the IVF index behind the
    rotation); nprobe is widened by N / allowed (up to nlist), so that about as many allowed
    items are scored as an unfiltered search scores items;
  - hnsw: ``SearchParametersHNSW(sel, efSearch)``, efSearch widened the same way: the walk
    walks through every node it meets but keeps only the allowed ones.

  PQ types take REFINE_FACTOR x k candidates (at least REFINE_MIN) in the codes' order and re-rank them by the exact
  vectors, as their unfiltered searches do (index.ann.tuning.refine). A query that still came
  back with fewer than min(k, allowed) items is searched again exactly over the allowed items
  (what clip-retrieval and autofaiss do for a filter an approximate index cannot honour).

Distances are the exact inner products of the items returned, except in a PQ gallery without
exact vectors (codes only: no embeddings.npy and no vector source): it is searched through the
index in the codes' order, short rows completed over the decoded codes, and its inner products
are those of the decoded codes (approximate, as its unfiltered searches are).

Removed items never come back: ``allowed`` holds live ids only (Gallery.search intersects it
with the catalog's ids), so no removed-items selector is needed beside this one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import faiss
import numpy as np

from nearsight.index.ann.faiss_index import IVF_TYPES, PQ_TYPES
from nearsight.index.ann.tuning import refine, refine_candidates

# filters allowing at most this many items are searched exactly over them: about where that
# costs what a filtered index search does (bench/filtered_search.py)
EXACT_MAX_ITEMS = 2048
HNSW_FILTER_EF_FACTOR = 4  # a filtered HNSW walk keeps more candidates: many are rejected
HNSW_FILTER_MIN_EF = 128  # and at least this many (a tuned efSearch may be as low as 16)
HNSW_FILTER_MAX_EF = 4096  # the widening's cap: a walk this wide visits most small graphs

VectorsOf = Callable[[np.ndarray], np.ndarray]


def exact_limit(depth: int) -> int:
    """The most allowed items searched exactly for ``depth`` neighbours: EXACT_MAX_ITEMS, or as
    many as a PQ search would re-rank anyway."""
    return max(EXACT_MAX_ITEMS, refine_candidates(depth))


def search_allowed(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    queries: np.ndarray,
    depth: int,
    allowed: np.ndarray,
    total: int,
    vectors_of: VectorsOf,
    *,
    exact_vectors: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(inner products, ids) [Q, depth] of the ``depth`` <= len(allowed) nearest allowed items
    (sorted int64 ids, all live, fewer than the ``total`` items), best first. ``vectors_of``:
    the items' vectors (Gallery.vectors_of); ``exact_vectors``: whether those are the vectors
    added (False: decoded PQ codes, see the module docstring)."""
    if exact_vectors and len(allowed) <= exact_limit(depth):
        return exact_search(queries, vectors_of, allowed, depth)
    rerank = index_type in PQ_TYPES and exact_vectors
    wanted = min(len(allowed), refine_candidates(depth)) if rerank else depth
    params = search_parameters(index, index_type, allowed, meta, wanted, total)
    # faiss.contrib.torch_utils may wrap Index.search without `params`; it keeps search_numpy
    search = getattr(index, "search_numpy", index.search)
    inner, found = search(queries, wanted, params=params)
    if rerank:
        inner, found = refine(queries, found, vectors_of, depth)
    if index_type == "flat":
        return inner, found
    return complete_rows(inner, found, queries, vectors_of, allowed)


def search_parameters(
    index: faiss.Index,
    index_type: str,
    allowed: np.ndarray,
    meta: dict[str, Any],
    depth: int,
    total: int,
) -> faiss.SearchParameters:
    """Search parameters whose selector admits only ``allowed`` (sorted int64 ids, of the
    ``total`` items), the probe or walk widened by total / allowed (module docstring)."""
    selector, bitmap = id_bitmap(allowed)
    widen = total / max(1, len(allowed))
    kept: list[Any] = [selector, bitmap]  # the C++ side holds bare pointers: keep them alive
    if index_type in IVF_TYPES:
        nlist = int(faiss.extract_index_ivf(index).nlist)
        nprobe = min(nlist, math.ceil(int(meta.get("nprobe", 8)) * widen))
        params = faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)
        if index_type == "opq":  # the IVF index sits behind the rotation
            kept.append(params)
            params = faiss.SearchParametersPreTransform(index_params=params)
    elif index_type == "hnsw":
        ef = int(meta.get("ef_search", 64))
        ef = max(ef * HNSW_FILTER_EF_FACTOR, min(HNSW_FILTER_MAX_EF, math.ceil(ef * widen)))
        params = faiss.SearchParametersHNSW(
            sel=selector, efSearch=max(ef, HNSW_FILTER_MIN_EF, depth)
        )
    else:
        params = faiss.SearchParameters(sel=selector)
    params.referenced_objects = kept
    return params


def id_bitmap(allowed: np.ndarray) -> tuple[faiss.IDSelector, np.ndarray]:
    """An ``IDSelectorBitmap`` admitting the ids ``allowed`` (sorted, >= 0), and its bits
    (to keep alive with it): one bit per id up to the largest, built in microseconds where an
    ``IDSelectorBatch`` hashes every id (milliseconds for tens of thousands)."""
    size = int(allowed[-1]) + 1 if len(allowed) else 1
    bits = np.zeros(size, dtype=bool)
    bits[allowed] = True
    packed = np.packbits(bits, bitorder="little")  # FAISS reads bit i of byte i >> 3
    # its n is the bitmap's size in bytes: ids past them are out, never read past the end
    return faiss.IDSelectorBitmap(len(packed), faiss.swig_ptr(packed)), packed


def exact_search(
    queries: np.ndarray,
    vectors_of: VectorsOf,
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
    vectors_of: VectorsOf,
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
