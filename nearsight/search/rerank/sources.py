"""Where re-ranking reads vectors and neighbour lists: a matrix under evaluation, or a gallery."""

from __future__ import annotations

from typing import TYPE_CHECKING

import faiss
import numpy as np

from nearsight.data.metrics.exclude import without_keys
from nearsight.index.gallery.graph import graph_neighbours

if TYPE_CHECKING:  # the gallery imports the re-ranking layer
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.rerank.pairwise import PairwiseReranker
    from nearsight.search.rerank.stage_store import StageStore

# OpenGallerySource.vectors_of reads up to this many keys directly; more go through np.unique so
# that a row wanted by many (DBA's neighbour lists) is read once
_DIRECT_KEYS = 256


class MatrixSource:
    """Rows of a [N, D] matrix (``nearsight eval``): neighbours from one exact kNN of every
    row, computed on first use (the evaluation is O(N^2) already)."""

    def __init__(
        self, vectors: np.ndarray, model_sha256: str | None = None, side: np.ndarray | None = None
    ) -> None:
        self.vectors = vectors
        self.model_sha256 = model_sha256  # the embedding model (None: not recorded)
        self.side = side  # the rows' stage features [N, F] (a format-2 pairwise re-ranker's)
        self._table: tuple[np.ndarray, np.ndarray] | None = None

    def vectors_of(self, keys: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors[np.asarray(keys)], dtype=np.float32)

    def side_of(self, keys: np.ndarray) -> np.ndarray | None:
        """The rows' stage features [len(keys), F], or None when none were given."""
        if self.side is None:
            return None
        return np.asarray(self.side[np.asarray(keys)], dtype=np.float32)

    def neighbours(self, keys: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        if self._table is None or self._table[1].shape[1] < depth:
            self._table = _exact_neighbours(self.vectors, depth)
        sims, rows = self._table
        return sims[keys, :depth], rows[keys, :depth]


class OpenGallerySource:
    """Items of an open gallery, by id, through its own index (every index type): always the
    gallery as it is now, segments added and removed items left out."""

    def __init__(
        self,
        gallery: Gallery,
        stage_store: StageStore | None = None,
        reranker: PairwiseReranker | None = None,
    ) -> None:
        self.gallery = gallery
        self.model_sha256 = gallery.model_sha256
        self.stage_store = stage_store  # the one a search checked already (else opened here)
        self.reranker = reranker  # the pairwise file that search opened (else opened by path)

    def vectors_of(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) <= _DIRECT_KEYS:  # a query's candidates: read as they are (repeats rare)
            return self.gallery.vectors_of(keys)
        unique, inverse = np.unique(keys, return_inverse=True)  # many: each row read once
        return self.gallery.vectors_of(unique)[inverse.reshape(-1)]

    def side_of(self, keys: np.ndarray) -> np.ndarray | None:
        """The items' stored stage features (nearsight rerank features), or None."""
        store = self.stage_store
        if store is None:
            from nearsight.search.rerank.stage_store import open_stage_store

            store = open_stage_store(self.gallery.path)
        return None if store is None else store.side_of(keys)

    def neighbours(self, keys: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """From the gallery's neighbour graph where it has one (a lookup), else (and for the
        items it cannot answer) through the index (a search per key)."""
        gallery = self.gallery
        unique, inverse = np.unique(np.asarray(keys, dtype=np.int64), return_inverse=True)
        vectors = gallery.vectors_of(unique)
        sims = np.full((len(unique), depth), -np.inf)
        found = np.full((len(unique), depth), -1, dtype=np.int64)
        answered = np.zeros(len(unique), dtype=bool)
        graph = gallery._graph
        if graph is not None and depth <= graph[0].shape[1]:
            base_ids = gallery._base[0]
            sims, found, answered = graph_neighbours(
                graph, base_ids, gallery._removed, gallery.added_items, unique, vectors, depth
            )
        rest = np.flatnonzero(~answered)
        if len(rest):
            distances, searched = gallery.search(vectors[rest], depth + 1)
            cos = 1.0 - np.square(distances.astype(np.float64)) / 2.0  # unit vectors
            sims[rest], found[rest] = _without_self(cos, searched, unique[rest], depth)
        return sims[inverse.reshape(-1)], found[inverse.reshape(-1)]


def _exact_neighbours(vectors: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    depth = min(depth, len(rows) - 1)
    sims, found = faiss.knn(rows, rows, depth + 1, metric=faiss.METRIC_INNER_PRODUCT)
    return _without_self(sims.astype(np.float64), found, np.arange(len(rows)), depth)


def _without_self(
    sims: np.ndarray, found: np.ndarray, keys: np.ndarray, depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """Drop each row's own key (or, where ties pushed it out, the last entry); pad to depth."""
    found, sims = without_keys(keys, found, sims)
    width = found.shape[1]
    if width < depth:
        sims = np.pad(sims, ((0, 0), (0, depth - width)), constant_values=-np.inf)
        found = np.pad(found, ((0, 0), (0, depth - width)), constant_values=-1)
    return sims[:, :depth], found[:, :depth]
