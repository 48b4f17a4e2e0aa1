"""What every retrieval metric takes: embeddings [N, D] and one label per row, checked (one-line
errors) and converted once (nearsight/data/metrics/retrieval.py, nearsight/data/metrics/nmi.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError


def prepare_embeddings(embeddings: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """float32 C-contiguous [N, D] vectors and int64 class codes 0..C-1 for faiss/numpy."""
    vectors = np.ascontiguousarray(np.asarray(embeddings), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] == 0:
        raise NearsightError(f"embeddings must be a 2-D array [N, D], got shape {vectors.shape}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(vectors):
        raise NearsightError(
            f"labels must be one per embedding: {labels.shape} labels for {len(vectors)} embeddings"
        )
    if len(vectors) < 2:
        raise NearsightError(f"need at least 2 items to evaluate retrieval, got {len(vectors)}")
    if not np.isfinite(vectors).all():
        raise NearsightError("embeddings contain NaN or infinite values")
    _, codes = np.unique(labels, return_inverse=True)
    return vectors, codes.astype(np.int64).reshape(-1)
