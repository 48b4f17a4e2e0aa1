"""alpha-QE: Radenovic, Tolias, Chum, TPAMI 2018, eq. (2).

q' = normalise(q + sum_{i<=k} max(s_i, 0)^alpha * x_i), s_i = q.x_i, x_i the top-k
neighbours of q among the candidates.
"""

from __future__ import annotations

import numpy as np


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def alpha_qe(queries: np.ndarray, cand: np.ndarray, k: int = 2, alpha: float = 3.0) -> np.ndarray:
    """Expand each query with its top-k candidates.

    queries: (Q, D) unit vectors; cand: (Q, N, D) candidate vectors per query, in any order
    (the caller has already removed the query itself under leave-one-out).
    Returns (Q, D) expanded unit queries.
    """
    sims = np.einsum("qd,qnd->qn", queries, cand)
    k = min(k, cand.shape[1])
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    s = np.take_along_axis(sims, top, axis=1)
    w = np.maximum(s, 0.0) ** alpha
    x = np.take_along_axis(cand, top[:, :, None], axis=1)
    return _normalise(queries + np.einsum("qk,qkd->qd", w, x))
