"""Unit vectors for the re-ranking benches (bench/rerank.py, bench/rerank_pairwise.py): rows made
unit, and random clustered unit vectors. Not a script."""

from __future__ import annotations

import numpy as np

DIM = 128  # the papers' embedding width


def clustered(n: int, dim: int = DIM, classes: int = 1000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    points = centres[rng.integers(0, classes, n)] + 0.8 * rng.standard_normal(
        (n, dim), dtype=np.float32
    )
    return unit(points)


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
