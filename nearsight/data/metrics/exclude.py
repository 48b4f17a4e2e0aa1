"""Leaving one item out of each row of search results (a gallery item used as a query)."""

from __future__ import annotations

import numpy as np


def without_keys(keys: np.ndarray, found: np.ndarray, *rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """``found`` [n, w] (and each array of ``rows``, the same shape) with one column fewer: in
    row i the entry equal to ``keys[i]`` is dropped, or, where it is absent (tied duplicates
    pushed it out, a filter or an approximate index missed it), the last entry."""
    n, width = found.shape
    if width == 0:
        return (found, *rows)
    drop = found == np.asarray(keys)[:, None]
    drop[~drop.any(axis=1), -1] = True
    return tuple(array[~drop].reshape(n, width - 1) for array in (found, *rows))
