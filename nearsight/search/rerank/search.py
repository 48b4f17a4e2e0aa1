"""A gallery search with re-ranking: the base index's candidates, re-ordered by a RerankSpec."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from nearsight.data.metrics.exclude import without_keys
from nearsight.search.rerank.pipeline import rerank
from nearsight.search.rerank.sources import GallerySource
from nearsight.search.rerank.spec import RerankSpec

if TYPE_CHECKING:  # the gallery imports the re-ranking layer
    from nearsight.index.gallery.core import Gallery


def reranked_search(
    gallery: Gallery,
    queries: np.ndarray,
    k: int,
    spec: RerankSpec,
    *,
    ids: np.ndarray | Sequence[int] | None = None,
    exclude: np.ndarray | Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(distances, ids) [Q, k'] as :meth:`Gallery.search` gives them, after re-ranking the top
    ``max(k, spec.depth)`` candidates. ``exclude``: per query, an item id left out of its
    answer and of every expansion (leave-one-out for a gallery item used as a query)."""
    depth = max(k, spec.depth) + (0 if exclude is None else 1)
    _, found = gallery.search(queries, depth, ids=ids)
    if exclude is not None:
        exclude = np.asarray(exclude, dtype=np.int64)
        (found,) = without_keys(exclude, found)
    if found.shape[1] == 0:
        return np.zeros(found.shape, np.float32), found
    keys, distances = rerank(spec, GallerySource(gallery), queries, found, exclude)
    keys, distances = keys[:, :k], distances[:, :k]
    return distances, keys

