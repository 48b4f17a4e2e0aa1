"""Search-time parameters tuned at build time, and the exact re-rank of compressed indexes.

An approximate index is built without a seeded sample of the gallery's own vectors
(``tuning_sample``: TUNING_QUERIES, at most a tenth of the gallery), which then query it as
held-out queries for their 10 nearest items; the exact 10 (faiss.knn over the vectors in the
index) are the reference; the sample is added after tuning. Held-out queries matter: a vector
already in an HNSW graph is one hop from its neighbours and finds them at an efSearch where
new queries miss some. A gallery too small to spare a sample tunes on its own vectors instead,
each query's own id dropped from both lists. nprobe (IVF
types) or efSearch (HNSW) grows in powers of two until recall@10 -- the mean share of the
exact 10 found -- reaches the target (TARGET_RECALL unless given); the value and the recall it
gave are stored in the gallery meta (``nprobe``/``ef_search``, ``tuned_recall_at_10``).

Compressed (PQ) indexes rank by approximate inner products; the gallery asks them for
REFINE_FACTOR x k candidates (at least REFINE_MIN) and re-ranks those by exact inner products with the stored
vectors (what faiss.IndexRefineFlat does, with the vectors read from the memory-mapped
embeddings.npy instead of a second in-memory copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import faiss
import numpy as np

from nearsight.index.ann.faiss_index import IVF_TYPES, PQ_TYPES

TARGET_RECALL = 0.95
TUNING_QUERIES = 1000
TUNING_K = 10
REFINE_FACTOR = 10
# at least the candidates a tuned k=10 search re-ranks: a k=1 search takes as many, not 10
REFINE_MIN = REFINE_FACTOR * TUNING_K


def refine_candidates(k: int) -> int:
    """How many candidates a PQ search of the ``k`` nearest asks the codes for."""
    return max(k * REFINE_FACTOR, REFINE_MIN)


HNSW_EF_VALUES = (16, 32, 64, 128, 256, 512, 1024)


def refine(
    queries: np.ndarray,
    candidates: np.ndarray,
    vectors_of: Callable[[np.ndarray], np.ndarray],
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Re-rank ``candidates`` [Q, C] (ids, -1 = none) of each query by exact inner product
    with the vectors ``vectors_of(ids)`` gives; returns (scores, ids) [Q, k], best first."""
    flat = candidates.reshape(-1)
    valid = flat >= 0
    rows = np.zeros((len(flat), queries.shape[1]), np.float32)
    if valid.any():
        rows[valid] = vectors_of(flat[valid])
    rows = rows.reshape(*candidates.shape, queries.shape[1])
    scores = np.einsum("qd,qcd->qc", queries, rows)
    scores[candidates < 0] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    top_scores = np.take_along_axis(scores, order, axis=1).astype(np.float32)
    top_ids = np.take_along_axis(candidates, order, axis=1)
    top_ids[~np.isfinite(top_scores)] = -1
    return top_scores, top_ids


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each row of ``exact`` (ids) present in the same row of ``found``."""
    hits = [len(np.intersect1d(a, b[b >= 0])) for a, b in zip(exact, found, strict=True)]
    return float(np.sum(hits) / exact.size) if exact.size else 1.0


def tuning_sample(count: int, index_type: str) -> np.ndarray:
    """Positions (sorted, seeded) of the vectors held out of an index of ``count`` vectors
    while it is tuned; empty when nothing is tuned or the gallery is too small to spare them."""
    if index_type not in (*IVF_TYPES, "hnsw") or count < 10 * (TUNING_K + 1):
        return np.zeros(0, np.int64)
    rng = np.random.default_rng(0)
    return np.sort(rng.choice(count, min(TUNING_QUERIES, count // 10), replace=False))


def tune(
    index: faiss.Index,
    index_type: str,
    vectors: np.ndarray,
    ids: np.ndarray,
    target: float = TARGET_RECALL,
    *,
    rerank: bool = True,
    held_out: np.ndarray | None = None,
) -> dict[str, Any]:
    """The smallest nprobe/efSearch reaching ``target`` recall@10 on a sample of ``vectors``
    (rows are ``ids``); sets it on ``index`` and returns the meta to store. Flat: nothing.
    ``held_out``: the positions ``tuning_sample`` gave, not in ``index`` yet, which are the
    queries; else a sample of the index's own vectors is. ``rerank``: PQ searches re-rank
    their candidates by the exact vectors (False: a gallery without them, searched in the
    codes' order)."""
    if index_type not in (*IVF_TYPES, "hnsw") or len(vectors) <= TUNING_K + 1:
        return {}
    if held_out is not None and len(held_out):
        sample, excluded = held_out, ids[held_out]
    else:
        rng = np.random.default_rng(0)
        count = min(TUNING_QUERIES, len(vectors))
        sample = np.sort(rng.choice(len(vectors), count, replace=False))
        excluded = None
    queries = np.ascontiguousarray(vectors[sample], dtype=np.float32)
    depth = TUNING_K + 1
    # deep enough that k remain once the held-out rows (not in the index) are dropped
    exact_depth = min(len(vectors), 3 * depth) if excluded is not None else depth
    _, exact_rows = faiss.knn(queries, vectors, exact_depth, metric=faiss.METRIC_INNER_PRODUCT)
    if excluded is not None:
        exact = _first_not_in(ids[exact_rows], excluded, TUNING_K)
    else:
        exact = _drop_self(ids[exact_rows], ids[sample], TUNING_K)
    position = {"ids": ids}

    def vectors_of(wanted: np.ndarray) -> np.ndarray:
        return np.asarray(vectors[np.searchsorted(position["ids"], wanted)], np.float32)

    def measure() -> float:
        if index_type in PQ_TYPES and rerank:
            _, candidates = index.search(queries, refine_candidates(depth))
            _, found = refine(queries, candidates, vectors_of, depth)
        else:
            _, found = index.search(queries, depth)
        if excluded is not None:
            return recall_at_k(found[:, :TUNING_K], exact)
        return recall_at_k(_drop_self(found, ids[sample], TUNING_K), exact)

    if index_type == "hnsw":
        # an HNSW gallery's index: IndexIDMap2 over IndexHNSWFlat (faiss_index.make_index)
        graph = faiss.downcast_index(cast(faiss.IndexIDMap2, index).index)
        hnsw = cast(faiss.IndexHNSW, graph).hnsw
        for value in HNSW_EF_VALUES:
            hnsw.efSearch = value
            recall = measure()
            if recall >= target:
                break
        return {"ef_search": value, "tuned_recall_at_10": round(recall, 4)}
    ivf = faiss.extract_index_ivf(index)
    value = 1
    while True:
        ivf.nprobe = value
        recall = measure()
        if recall >= target or value >= ivf.nlist:
            break
        value = min(2 * value, ivf.nlist)
    return {"nprobe": value, "tuned_recall_at_10": round(recall, 4)}


def _first_not_in(rows: np.ndarray, excluded: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` ids of each row that are not in ``excluded`` (-1 past the end)."""
    out = np.full((len(rows), k), -1, np.int64)
    allowed = ~np.isin(rows, excluded)
    for row, (values, keep) in enumerate(zip(rows, allowed, strict=True)):
        kept = values[keep][:k]
        out[row, : len(kept)] = kept
    return out


def _drop_self(found: np.ndarray, query_ids: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` ids of each row other than the query's own (or the first k)."""
    out = np.empty((len(found), k), np.int64)
    for row, (ids, own) in enumerate(zip(found, query_ids, strict=True)):
        others = ids[ids != own]
        out[row] = others[:k] if len(others) >= k else ids[:k]
    return out
