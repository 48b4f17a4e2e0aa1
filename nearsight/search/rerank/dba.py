"""Database-side augmentation (DBA), Radenovic et al. TPAMI 2018, Sec. 4 (alpha-weighted).

Each gallery vector x is replaced by normalise(x + sum_{i<=k} max(s_i,0)^alpha * n_i) over its
top-k gallery neighbours n_i other than itself. Precomputable once per gallery generation.
"""

from __future__ import annotations

import numpy as np

from nearsight.search.rerank.aqe import alpha_qe


def dba(vectors: np.ndarray, k: int = 2, alpha: float = 3.0) -> np.ndarray:
    """Return the DBA vectors for a (N, D) unit-vector gallery (exact, self excluded)."""
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    k = min(k, len(vectors) - 1)
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return alpha_qe(vectors, vectors[top], k=k, alpha=alpha)
