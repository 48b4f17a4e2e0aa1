"""Re-order base-search candidates (ids + vectors from the vector store) by a RerankSpec."""

from __future__ import annotations

import numpy as np

from nearsight.index.rerank.aqe import alpha_qe
from nearsight.index.rerank.kreciprocal import k_reciprocal_distance
from nearsight.index.rerank.spec import RerankSpec


def rerank_candidates(
    spec: RerankSpec, queries: np.ndarray, ids: np.ndarray, cand: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return (ids, scores) re-sorted, higher score is better; shapes (Q, N).

    For `dba`/`dba+aqe` pass DBA vectors of the candidates as `cand`. Under leave-one-out the
    caller must drop the query's own id from `ids`/`cand` first (and, for DBA, use vectors
    computed without the query's contribution).
    """
    p = spec.params
    if spec.method in ("aqe", "dba+aqe"):
        queries = alpha_qe(queries, cand, k=int(p["k"]), alpha=float(p["alpha"]))
    if spec.method == "kreciprocal":
        scores = -k_reciprocal_distance(queries, cand, int(p["k1"]), int(p["k2"]), float(p["lambda"]))
    else:
        scores = np.einsum("qd,qnd->qn", queries, cand)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)
