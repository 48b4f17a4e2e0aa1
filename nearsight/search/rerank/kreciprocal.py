"""k-reciprocal re-ranking: Zhong, Zheng, Cao, Li, CVPR 2017 (eqs. 4-12).

Works on the query plus its N candidates (M = N + 1 points). d = 2 - 2 cos (squared L2 of
unit vectors). R(p,k) = {g in kNN(p,k+1) : p in kNN(g,k+1)} (eq. 4); R* adds R(c, k/2) for
c in R(p,k1) when |R(p,k1) & R(c,k/2)| > 2/3 |R(c,k/2)| (eq. 6); V_p,g = exp(-d(p,g)) on R*
normalised to sum 1 (eq. 7); local QE averages V over the top-k2 of p (eq. 10); Jaccard
d_J = 1 - sum min / sum max (eq. 11); final (1-lambda) d_J + lambda d (eq. 12).
"""

from __future__ import annotations

import numpy as np


def _knn_mask(d: np.ndarray, k: int) -> np.ndarray:
    """(Q, M, M) boolean: [q, i, j] is j among the k nearest of i (self included). Only the
    set matters, so a partition (O(M)) rather than a sort."""
    if k >= d.shape[2]:
        return np.ones(d.shape, dtype=bool)
    top = np.argpartition(d, k - 1, axis=2)[:, :, :k]
    mask = np.zeros(d.shape, dtype=bool)
    np.put_along_axis(mask, top, True, axis=2)
    return mask


def k_reciprocal_distance(
    queries: np.ndarray, cand: np.ndarray, k1: int = 20, k2: int = 6, lam: float = 0.3
) -> np.ndarray:
    """Return (Q, N) final distances from each query to its N candidates (smaller is closer)."""
    pts = np.concatenate([queries[:, None, :], cand], axis=1).astype(np.float64)
    m = pts.shape[1]
    d = np.maximum(2.0 - 2.0 * np.einsum("qid,qjd->qij", pts, pts), 0.0)
    fwd = _knn_mask(d, min(k1 + 1, m))
    rec = fwd & fwd.transpose(0, 2, 1)
    half_f = _knn_mask(d, min(int(round(k1 / 2)) + 1, m))
    half = half_f & half_f.transpose(0, 2, 1)
    # set sizes and unions as 0/1 products; einsum, not BLAS: matrices this small run
    # fastest on one thread, and BLAS's thread pool costs milliseconds to wake per query
    ones = half.astype(np.float32)
    overlap = np.einsum("qij,qcj->qic", rec.astype(np.float32), ones)
    take = rec & (overlap > (2.0 / 3.0) * half.sum(axis=2)[:, None, :])
    expanded = rec | (np.einsum("qic,qcj->qij", take.astype(np.float32), ones) > 0)
    v = np.where(expanded, np.exp(-d), 0.0)
    v /= v.sum(axis=2, keepdims=True)
    if k2 > 1:
        near = _knn_mask(d, min(k2, m)).astype(np.float64)
        v = np.einsum("qij,qjk->qik", near, v) / near.sum(axis=2, keepdims=True)
    inter = np.minimum(v[:, :1, :], v[:, 1:, :]).sum(axis=2)
    union = np.maximum(v[:, :1, :], v[:, 1:, :]).sum(axis=2)
    jaccard = 1.0 - inter / union
    return (1.0 - lam) * jaccard + lam * d[:, 0, 1:]
