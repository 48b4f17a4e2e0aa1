"""Re-ranking a base search's candidates, given where their vectors and neighbours come from.

One path for every caller: ``nearsight eval`` (the candidates are rows of the evaluated
vectors, the neighbour table is an exact kNN of them), and searches of a gallery (the
candidates are gallery ids from any index type, PQ included; vectors and neighbours come from
the gallery, :mod:`nearsight.search.rerank.gallery_source`).

Leave-one-out: ``exclude`` names, per query, a key that must take no part in its answer (the
query's own item under evaluation). It is dropped from the candidates by the caller's base
search and, here, from every candidate's DBA neighbours, so no query reaches itself through an
expansion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from nearsight.search.rerank.aqe import alpha_qe
from nearsight.search.rerank.kreciprocal import k_reciprocal_distance
from nearsight.search.rerank.spec import RerankSpec

# queries per k-reciprocal block: its (block, depth, depth) float64 arrays stay tens of MB
_KRECIPROCAL_BLOCK = 32


class RerankSource(Protocol):
    """Where candidate vectors and neighbour lists come from; keys are ids (or row numbers)."""

    def vectors_of(self, keys: np.ndarray) -> np.ndarray:
        """float32 [len(keys), D] vectors of existing keys (1-D, any order, repeats allowed)."""
        ...

    def neighbours(self, keys: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """(similarities, keys) [len(keys), depth] of each key's nearest other items, best first,
        the key itself left out; missing entries have key -1."""
        ...


def rerank(
    spec: RerankSpec,
    source: RerankSource,
    queries: np.ndarray,
    candidates: np.ndarray,
    exclude: np.ndarray | None = None,
    query_side: np.ndarray | None = None,
    query_keys: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Re-order ``candidates`` [Q, N] (keys, -1 for none) of ``queries`` [Q, D] by ``spec``.

    ``query_side``: the queries' stage features [Q, F], for a pairwise re-ranker that takes
    them (the candidates' come from ``source.side_of``); or ``query_keys``: the source's keys
    whose stored features are the queries' (searches by item).

    Returns (keys, distances) [Q, N], nearest first, missing candidates last with key -1 and
    distance inf. Distances: Euclidean between the (expanded) query and the (augmented)
    candidate for aqe/dba, the mixed Jaccard distance (Zhong et al., eq. 12) for kreciprocal,
    minus the learned score for pairwise (which re-orders only its first ``depth`` candidates:
    the rest follow in the base order, at distance inf).
    """
    queries = np.asarray(queries, dtype=np.float32)
    candidates = np.asarray(candidates, dtype=np.int64)
    q, n = candidates.shape
    if q == 0 or n == 0 or not spec.active:
        raise ValueError("rerank needs candidates and an active spec")
    valid = candidates >= 0
    full = bool(valid.all())  # the usual case: no missing candidate to mask (fewer copies)
    if full:
        vectors = source.vectors_of(candidates.reshape(-1)).reshape(q, n, queries.shape[1])
    else:
        vectors = np.zeros((q, n, queries.shape[1]), dtype=np.float32)
        vectors[valid] = source.vectors_of(candidates[valid])
    params = spec.params
    if spec.method in ("dba", "dba+aqe"):
        vectors[valid] = _augmented(source, candidates, vectors, valid, exclude, params)
    if spec.method in ("aqe", "dba+aqe"):
        queries = _expanded(queries, vectors, valid, params)
    if spec.method == "pairwise":  # a learned scorer of the first depth pairs (ONNX)
        from nearsight.search.rerank.pairwise import pairwise_distances

        model = getattr(source, "model_sha256", None)
        side = _side(source, candidates, valid, query_side, query_keys)
        opened = getattr(source, "reranker", None)  # a search opened it already
        distances = pairwise_distances(params, queries, vectors, valid, model, side, opened)
    elif spec.method == "kreciprocal":
        distances = _k_reciprocal(queries, vectors, valid, params)
    else:
        scores = np.einsum("qd,qnd->qn", queries.astype(np.float64), vectors.astype(np.float64))
        distances = np.sqrt(np.maximum(2.0 - 2.0 * scores, 0.0))
    if not full:
        distances = np.where(valid, distances, np.inf)
    order = np.argsort(distances, axis=1, kind="stable")
    rows = np.arange(q)[:, None]  # take_along_axis, without its per-call index building
    return candidates[rows, order], distances[rows, order].astype(np.float32)


def _side(
    source: RerankSource,
    candidates: np.ndarray,
    valid: np.ndarray,
    query_side: np.ndarray | None,
    query_keys: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(query, candidate) stage features where the caller and the source both have them."""
    side_of = getattr(source, "side_of", None)
    if side_of is None or (query_side is None and query_keys is None):
        return None
    wanted = candidates[valid]
    if query_side is None:  # the queries are items: their rows and the candidates' in one read
        wanted = np.concatenate([np.asarray(query_keys, dtype=np.int64), wanted])
    found = side_of(wanted)
    if found is None:
        return None
    if query_side is None:
        assert query_keys is not None  # checked above: keys when no features are given
        query_side, found = found[: len(query_keys)], found[len(query_keys) :]
    if valid.all():  # the usual case: no zero rows to place
        out = found.reshape(*candidates.shape, found.shape[1])
    else:
        out = np.zeros((*candidates.shape, found.shape[1]), dtype=np.float32)
        out[valid] = found
    return np.asarray(query_side, dtype=np.float32), out


def _augmented(
    source: RerankSource,
    candidates: np.ndarray,
    vectors: np.ndarray,
    valid: np.ndarray,
    exclude: np.ndarray | None,
    params: Mapping[str, Any],
) -> np.ndarray:
    """DBA vectors (Radenovic et al., alpha-weighted) of the valid candidates, each from its
    top-k gallery neighbours other than itself and other than its query's ``exclude`` key."""
    k, alpha = int(params["k"]), float(params["alpha"])
    keys = candidates[valid]
    sims, neighbours = source.neighbours(keys, k + 1)  # one spare for the excluded key
    drop = neighbours < 0
    if exclude is not None:
        excluded = np.broadcast_to(np.asarray(exclude)[:, None], candidates.shape)[valid]
        drop |= neighbours == excluded[:, None]
    keep = np.argsort(drop, axis=1, kind="stable")[:, :k]  # the first k kept, in order
    sims = np.take_along_axis(sims, keep, axis=1)
    neighbours = np.take_along_axis(neighbours, keep, axis=1)
    gone = np.take_along_axis(drop, keep, axis=1)
    weights = np.where(gone, 0.0, np.maximum(sims, 0.0) ** alpha)
    neighbour_vectors = np.zeros((*neighbours.shape, vectors.shape[2]), dtype=np.float64)
    neighbour_vectors[~gone] = source.vectors_of(neighbours[~gone])
    summed = vectors[valid].astype(np.float64) + np.einsum("nk,nkd->nd", weights, neighbour_vectors)
    return _normalise(summed).astype(np.float32)


def _expanded(
    queries: np.ndarray, vectors: np.ndarray, valid: np.ndarray, params: Mapping[str, Any]
) -> np.ndarray:
    """alpha-QE over the valid candidates (missing ones can never be among the top k)."""
    k, alpha = int(params["k"]), float(params["alpha"])
    safe = np.where(valid[:, :, None], vectors, 0.0).astype(np.float64)
    # a missing candidate scores below any real one (cosines are >= -1)
    sims = np.where(valid, np.einsum("qd,qnd->qn", queries.astype(np.float64), safe), -3.0)
    k = min(k, vectors.shape[1])
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    picked = np.take_along_axis(safe, top[:, :, None], axis=1)
    return alpha_qe(queries.astype(np.float64), picked, k=k, alpha=alpha).astype(np.float32)


def _k_reciprocal(
    queries: np.ndarray, vectors: np.ndarray, valid: np.ndarray, params: Mapping[str, Any]
) -> np.ndarray:
    """Zhong et al.'s final distance to each candidate, queries taken in blocks; rows with
    missing candidates use only their valid ones (the rest come back inf)."""
    out = np.full(valid.shape, np.inf)
    k1, k2, lam = int(params["k1"]), int(params["k2"]), float(params["lambda"])
    full = np.asarray(valid.all(axis=1), dtype=bool)
    for rows in (np.flatnonzero(full), np.flatnonzero(~full)):
        for start in range(0, len(rows), _KRECIPROCAL_BLOCK):
            block = rows[start : start + _KRECIPROCAL_BLOCK]
            if full[block[0]]:
                out[block] = k_reciprocal_distance(queries[block], vectors[block], k1, k2, lam)
                continue
            for row in block:  # rare: an approximate index found fewer than depth items
                kept = np.flatnonzero(valid[row])
                if len(kept):
                    out[row, kept] = k_reciprocal_distance(
                        queries[row : row + 1], vectors[row : row + 1, kept], k1, k2, lam
                    )[0]
    return out


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
