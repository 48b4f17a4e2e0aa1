"""A gallery's FAISS index as it is searched: read from the folder, with the added segments
put in and the removed items dropped, its search parameters applied, a GPU copy when a GPU is
there, and the two ways through it: the whole index (re-ranked by exact vectors for PQ codes)
or only some items (a filter: nearsight/index/ann/filtered.py).

:class:`nearsight.index.gallery.core.Gallery` makes one per load of the folder; its ``search``
checks the query and the allowed ids, then asks :meth:`IndexSearch.nearest`.
"""

from __future__ import annotations

import threading
from typing import Any

import faiss
import numpy as np

from nearsight.index.ann import filtered
from nearsight.index.ann.faiss_index import (
    HNSW_EF_SEARCH,
    IVF_TYPES,
    PQ_TYPES,
    apply_search_parameters,
    to_gpu,
)
from nearsight.index.ann.filter_plan import Costs
from nearsight.index.ann.filter_tuning import calibrate
from nearsight.index.ann.tuning import refine, refine_candidates
from nearsight.index.vector_store import VectorStore

GPU_MAX_K = 2048  # FAISS's GPU k-selection limit: deeper searches run on the CPU index


class IndexSearch:
    """The index of one load of a gallery (``index``: as read from index.faiss), searched from
    any number of threads. ``ids``: the live item ids, sorted; ``base``: (the base index's ids,
    embeddings.npy or None); ``store``: the items' vectors (nearsight/index/vector_store.py).
    ``serving``: False for a writer's private read, which is never searched (no GPU copy)."""

    def __init__(
        self,
        index: faiss.Index,
        meta: dict[str, Any],
        ids: np.ndarray,
        base: tuple[np.ndarray, np.ndarray | None],
        segments: list[tuple[np.ndarray, np.ndarray]],
        removed: np.ndarray,
        store: VectorStore,
        *,
        serving: bool,
    ):
        self.meta = meta
        self.index_type = str(meta["index_type"])
        self.ids = ids
        self.base = base
        self.store = store
        for segment_ids, segment_vectors in segments:
            index.add_with_ids(segment_vectors, segment_ids)
        self.excluded = None  # HNSW cannot remove points: its searches skip removed ids
        if len(removed) and self.index_type == "hnsw":
            batch = faiss.IDSelectorBatch(removed)
            self.excluded = faiss.IDSelectorNot(batch)
            # the SWIG wrapper does not keep it; faiss's stubs lack SWIG's dynamic attributes
            self.excluded.referenced_objects = [batch]  # type: ignore[attr-defined]
        elif len(removed):
            # faiss's Python wrapper takes an id array; its stubs only the C++ IDSelector
            index.remove_ids(removed)  # type: ignore[arg-type]
        self.index = index
        apply_search_parameters(index, meta)
        stored = (meta.get("filter_route") or {}).get("costs")
        self.filters = filtered.FilterState(
            costs=Costs.from_meta(stored) if stored else filtered.default_costs(),
            calibrate=self._calibrate_filters,
        )
        self._gpu_lock = threading.Lock()
        self.gpu_index = to_gpu(index, self.index_type) if serving else None
        if self.index_type in IVF_TYPES and serving:  # each list's ids, before any search
            filtered.lists_of(index, self.filters)

    def nearest(
        self,
        queries: np.ndarray,
        depth: int,
        allowed: np.ndarray | None,
        info: dict[str, Any] | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(inner products, ids) [Q, depth] of the ``depth`` nearest items of each query among
        ``allowed`` (live ids, sorted, distinct; None: every item); ``info``: what a filtered
        search fills in (index.ann.filtered)."""
        if allowed is None or len(allowed) == len(self.ids):
            return self._search_index(queries, depth)
        # PQ codes only (no exact vectors): the codes' order, as unfiltered (index.ann.filtered)
        exact = self.index_type not in PQ_TYPES or self.store.can_rerank
        return filtered.search_allowed(
            self.index,
            self.index_type,
            self.meta,
            queries,
            depth,
            allowed,
            len(self.ids),
            self.store.vectors_of,
            exact_vectors=exact,
            rows_of=self._rows_of,
            state=self.filters,
            info=info,
        )

    def _search_index(self, queries: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        if self.index_type not in PQ_TYPES:
            return self._search_raw(queries, depth)
        if not self.store.can_rerank:  # no exact vectors to re-rank by: the codes' order
            return self._search_raw(queries, depth)
        # compressed codes rank roughly: re-rank more candidates by the exact vectors
        _, candidates = self._search_raw(queries, min(len(self.ids), refine_candidates(depth)))
        return refine(queries, candidates, self.store.vectors_of, depth)

    def _search_raw(self, queries: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        if self.gpu_index is not None and depth <= GPU_MAX_K:
            with self._gpu_lock:
                return self.gpu_index.search(queries, depth)
        if self.index_type == "hnsw":
            ef = max(int(self.meta.get("ef_search", HNSW_EF_SEARCH)), depth)
            # faiss.contrib.torch_utils (imported by pytorch-metric-learning's
            # AccuracyCalculator) replaces Index.search with a wrapper that has no `params`;
            # it keeps the original as search_numpy
            search = getattr(self.index, "search_numpy", self.index.search)
            # SearchParametersHNSW: in faiss's SWIG module, missing from its stubs
            params = faiss.SearchParametersHNSW(efSearch=ef)  # type: ignore[attr-defined]
            if self.excluded is not None:
                params.sel = self.excluded
            return search(queries, depth, params=params)
        return self.index.search(queries, depth)

    def _rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        return filtered.rows_in(*self.base, ids)

    def _calibrate_filters(self) -> Costs:
        """This machine's costs of filtered searches, measured once (index.ann.filter_tuning)."""
        return calibrate(self.index, self.index_type, self.meta, self.ids,
                         self.store.vectors_of, self._rows_of)  # fmt: skip
