"""A gallery search with re-ranking: the base index's candidates, re-ordered by a RerankSpec."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from nearsight.data.metrics.exclude import without_keys
from nearsight.search.rerank.pipeline import rerank
from nearsight.search.rerank.sources import OpenGallerySource
from nearsight.search.rerank.spec import MAX_DEPTH, RerankSpec

if TYPE_CHECKING:  # the gallery imports the re-ranking layer
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.rerank.pairwise import PairwiseReranker
    from nearsight.search.rerank.rerankers import Reranker
    from nearsight.search.rerank.stage_store import StageStore


def reranked_search(
    gallery: Gallery,
    queries: np.ndarray,
    k: int,
    spec: RerankSpec,
    *,
    ids: np.ndarray | Sequence[int] | None = None,
    exclude: np.ndarray | Sequence[int] | None = None,
    info: dict | None = None,
    query_ids: np.ndarray | Sequence[int] | None = None,
    query_side: np.ndarray | None = None,
    fixed_depth: bool = False,
    built: Reranker | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(distances, ids) [Q, k'] as :meth:`Gallery.search` gives them, after re-ranking the top
    ``spec.depth`` candidates (at least ``k`` of them, and at most :data:`MAX_DEPTH` whatever
    ``k`` is: past it the base order continues). ``fixed_depth``: exactly ``spec.depth`` of
    them whatever ``k`` is (the base order past it), so that a longer search never reorders
    a shorter one's ranks (the search route's pages). ``exclude``: per query, an item id left out
    of its answer and of every expansion (leave-one-out for a gallery item used as a query).
    ``query_ids``: per query, the gallery item it is (-1: none), whose stored stage features a
    pairwise re-ranker of stage features needs (default: ``exclude``). ``query_side``: the
    stage features [Q, F] of the queries that are not gallery items (query images, from the
    gallery's stage model: nearsight.search.rerank.stage_query); rows of item queries are
    ignored. ``built``: ``spec`` made ready for this gallery once (nearsight.search.rerank.
    rerankers), else made ready here, for this search."""
    if built is None:
        from nearsight.search.rerank.rerankers import build_reranker

        built = build_reranker(gallery, spec)
    query_side, item_keys, store, reranker = _query_side(
        built, exclude if query_ids is None else query_ids, len(queries), query_side
    )
    depth = min(spec.depth if fixed_depth else max(k, spec.depth), MAX_DEPTH)
    extra = 0 if exclude is None else 1
    _, found = gallery.search(queries, max(k, depth) + extra, ids=ids, info=info)
    if exclude is not None:
        exclude = np.asarray(exclude, dtype=np.int64)
        (found,) = without_keys(exclude, found)
    if found.shape[1] == 0:
        return np.zeros(found.shape, np.float32), found
    head, tail = found[:, :depth], found[:, depth:k]
    source = OpenGallerySource(gallery, store, built.pairwise)
    keys, distances = rerank(spec, source, queries, head, exclude, query_side, item_keys)
    if tail.shape[1]:  # beyond the re-ranked depth: the index's order, after it
        keys = np.concatenate([keys, tail], axis=1)
        distances = np.concatenate([distances, np.full(tail.shape, np.inf, np.float32)], axis=1)
    return distances[:, :k], keys[:, :k]


def _query_side(
    built: Reranker,
    query_ids: np.ndarray | Sequence[int] | None,
    count: int,
    given: np.ndarray | None,
) -> tuple[np.ndarray | None, np.ndarray | None, StageStore | None, PairwiseReranker | None]:
    """For a re-ranker that needs stage features (else Nones): the queries' features (an
    image's ``given`` ones, an item's stored ones) or, when every query is a gallery item,
    their ids instead (read with the candidates' rows, in one lookup); the gallery's store
    they come from, checked (the candidates' come from it too); and that re-ranker, as
    ``built`` opened it."""
    from nearsight.core.errors import NearsightError

    reranker, store = built.pairwise, built.store
    if reranker is None or store is None:
        return None, None, None, None
    ids = np.full(count, -1) if query_ids is None else np.asarray(query_ids, dtype=np.int64)
    items = ids >= 0
    if not items.all() and given is None:
        raise NearsightError(
            f"re-ranker {reranker.path} scores by the query image's {reranker.side_stage} "
            "features too, and a vector query has no image: search by an image or a gallery "
            "item, or re-rank with an embeddings-only re-ranker"
        )
    if items.all():  # searches by gallery item: their stored rows, read with the candidates'
        return None, ids, store, reranker
    given = np.asarray(given, dtype=np.float32)
    if given.shape != (count, store.dim):
        raise NearsightError(
            f"re-ranker {reranker.path} takes {store.dim}-d {reranker.side_stage} features "
            f"of {count} queries, got an array of shape {tuple(given.shape)}"
        )
    out = np.array(given, dtype=np.float32)  # a copy: item queries' rows are replaced
    if items.any():
        out[items] = store.side_of(ids[items])
    return out, None, store, reranker
