"""Query images to query vectors, for a :class:`~nearsight.search.searcher.Searcher`.

One rule for one image and for many: a query whose file has a gallery item's bytes is that
item (its stored vector, and it comes first at distance 0); the others are embedded together,
by the gallery's embedder, or, when the re-ranker scores by a trunk stage's features too, by
one run of the gallery's stage model that gives both the vectors and those features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from nearsight.data.image_input import QueryImage
from nearsight.search.rerank.rerankers import Reranker


class QuerySearcher(Protocol):
    """What embedding queries needs of a searcher (the Searcher, which imports this module)."""

    @property
    def gallery(self) -> Any: ...

    @property
    def embedder(self) -> Any: ...

    def identical_item(self, sha256: str) -> int | None: ...

    def item_vector(self, item_id: int) -> np.ndarray: ...

    def stage_model(self, rerank: Reranker) -> Any: ...


def embed_queries(
    searcher: QuerySearcher, decoded: Sequence[QueryImage], rerank: Reranker
) -> tuple[np.ndarray, list[int | None], np.ndarray | None]:
    """(vectors [Q, D], the gallery item each query is or None, stage features [Q, F] or None).

    The features are None unless ``rerank`` takes them and some query was embedded; a row of a
    query that is an item stays zero (the re-ranker reads that item's stored features)."""
    twins = [searcher.identical_item(q.sha256) if q.sha256 else None for q in decoded]
    vectors = np.zeros((len(decoded), searcher.gallery.dim), dtype=np.float32)
    fresh = [n for n, twin in enumerate(twins) if twin is None]
    side = None
    if fresh:
        images = [decoded[n].image for n in fresh]
        stage = searcher.stage_model(rerank)
        if stage is not None:
            embedded, features = stage.images_with_stage(images)
            side = np.zeros((len(decoded), features.shape[1]), dtype=np.float32)
            side[fresh] = features
        else:
            embedded = searcher.embedder.embed_images(images)
        vectors[fresh] = np.asarray(embedded, dtype=np.float32)
    for n, twin in enumerate(twins):
        if twin is not None:
            vectors[n] = searcher.item_vector(twin)
    return vectors, twins, side
