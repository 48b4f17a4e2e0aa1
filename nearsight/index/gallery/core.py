"""The gallery: a folder holding a catalog, a FAISS index and the embeddings, always consistent.

Layout (DESIGN.md): nearsight/index/gallery/files.py. ``embeddings.npy`` is optional past the memory
budget; item vectors then come back from the index or the imported files (nearsight/index/vector_store.py).

This module reads a gallery: :class:`Gallery` opens and checks it, searches and evaluates it.
Writing (copy-on-write, crash-safe, serialised by a lock): building whole in
nearsight/index/gallery/write.py, ``add``, ``remove`` and ``compact`` in
nearsight/index/gallery/change.py. Readers take the lock shared while they load, so they never
see the instant between the two renames of a replace.

Index types, their parameters and the distance reported: nearsight/index/ann/faiss_index.py. Locking and
recovery after a killed writer: nearsight/index/gallery/lock.py.

The parameters are stored in the catalog meta (``nlist``, ``nprobe``, ``hnsw_m``,
``ef_construction``, ``ef_search``). With a GPU (``faiss.get_num_gpus() > 0``) flat and IVF
indexes are searched on it; the file is always the CPU index.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.metrics.exclude import without_keys
from nearsight.index.ann import coarse
from nearsight.index.ann.faiss_index import unit_distance
from nearsight.index.ann.index_choice import parse_memory
from nearsight.index.catalog.facets import BINS, TOP_VALUES, Facets, column_facets
from nearsight.index.catalog.filters import Condition, parse_filter
from nearsight.index.catalog.payload_index import PayloadIndex
from nearsight.index.catalog.store import Catalog, GalleryError
from nearsight.index.gallery import change as gallery_change
from nearsight.index.gallery import model as gallery_model
from nearsight.index.gallery import payload as gallery_payload
from nearsight.index.gallery.index_search import IndexSearch
from nearsight.index.gallery.load import read_folder
from nearsight.index.vector_store import VectorStore

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.models.embedder import Embedder

# -- the open gallery ------------------------------------------------------------------------


class Gallery:
    """An open gallery: catalog, index and embeddings, checked to agree. Use :meth:`open`.

    The object is a snapshot: ``add`` and ``remove`` rewrite the folder and refresh this object;
    changes made by other processes are seen after :meth:`reload`. Searching from several
    threads at once is safe."""

    def __init__(self, path: Path):
        self.path = path
        self._catalog: Catalog | None = None

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, gallery_dir: str | os.PathLike[str], *, model: Embedder | None = None) -> Gallery:
        """Open and check the gallery at ``gallery_dir``; with ``model`` (an Embedder: ``dim``
        and ``model_sha256``) also check it is the model the gallery was built with."""
        gallery = cls(Path(gallery_dir).expanduser().absolute())
        gallery._load()
        if model is not None:
            try:
                gallery.check_model(model)
            except BaseException:
                gallery.close()
                raise
        return gallery

    def reload(self) -> None:
        """Read the gallery again from disk (after another process changed it)."""
        self._load()

    def _load(self, *, locked: bool = False) -> None:
        """Read and check the folder; ``locked``: the caller holds the write lock already (a
        second flock from this process would wait for itself)."""
        read = read_folder(self.path, locked=locked)
        catalog, meta, ids, labels = read.catalog, read.meta, read.ids, read.labels
        index, base_ids, embeddings = read.index, read.base_ids, read.embeddings
        segments, removed, graph = read.segments, read.removed, read.graph
        self.close()
        self._catalog = catalog
        self._payload = read.payload  # None: filters in SQL (nearsight/index/gallery/payload.py)
        self._column_types = gallery_payload.column_types(read.payload, catalog, meta)
        self.meta: dict[str, Any] = meta
        self.ids: np.ndarray = ids  # catalog ids in order; row i of embeddings is ids[i]
        self.labels: np.ndarray = labels  # -1 where unlabelled
        self.dim: int = int(meta["dim"])
        self.index_type: str = str(meta["index_type"])
        self.model_sha256: str = str(meta["model_sha256"])
        # the base as written, then the segments added and the removed ids dropped in memory
        self._base = (base_ids, embeddings)
        self._segments = segments
        self._removed = removed
        self._graph = graph  # optional (nearsight/index/gallery/graph.py)
        self._added: tuple[np.ndarray, np.ndarray] | None = None
        self._embeddings: np.ndarray | None = None
        self._store = VectorStore(
            index,
            self.index_type,
            base_ids,
            embeddings,
            segments,
            meta.get("vector_source"),
            parse_memory(meta.get("memory_budget")),
        )
        # a writer's private read (locked) is never searched: no GPU copy for it
        self._search = IndexSearch(index, meta, ids, self._base, segments, removed, self._store,
                                   serving=not locked)  # fmt: skip
        self._index = index  # segments added, removed ids dropped (not for HNSW)
        self._filters = self._search.filters  # the filtered searches' costs and history
        if self.index_type == "hnsw":  # its filtered searches' coarse partition, if built
            self._filters.partition = coarse.read_partition(self.path)

    def model_path(self, override: str | os.PathLike[str] | None = None) -> Path:
        """The model to embed queries with: ``override``, else the one the gallery records
        (one-line NearsightError when it records none or the file is gone)."""
        return gallery_model.model_path(self, override)

    def load_model(
        self,
        override: str | os.PathLike[str] | None = None,
        *,
        device: str = "auto",
        optimization: str = "all",
    ) -> Embedder:
        """The embedder of this gallery's queries (``override`` or its recorded model, run
        as its recorded spec says), checked to be the model it was built with."""
        return gallery_model.load_model(self, override, device=device, optimization=optimization)

    def check_model(self, model: Embedder, name: str | os.PathLike[str] | None = None) -> None:
        """GalleryError unless ``model`` (``dim``, ``model_sha256``) is the gallery's model."""
        gallery_model.check_model(self, model, name)

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def embeddings(self) -> np.ndarray:
        """float32 [N, D]; row i is the vector of ``ids[i]``. Without segments or removals,
        the memory-mapped embeddings.npy itself; else (or when the gallery has no
        embeddings.npy) gathered once, on first use, by :class:`nearsight.index.vector_store.VectorStore`
        (read back from the index: approximate for PQ types, see :attr:`vectors_exact`)."""
        if self._embeddings is None:
            _, base = self._base
            if base is not None and not self._segments and not len(self._removed):
                self._embeddings = base
            else:
                self._embeddings = self._store.rows(self.ids)
        return self._embeddings

    @property
    def embeddings_kept(self) -> bool:
        """Whether the gallery holds embeddings.npy (its build may drop it past the budget)."""
        return self._base[1] is not None

    @property
    def added_items(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, vectors) of the items added since the base index was written and not removed
        (the segments, gathered once), or None when there are none."""
        if self._added is None and self._segments:
            ids = np.concatenate([segment_ids for segment_ids, _ in self._segments])
            vectors = np.concatenate([segment_vectors for _, segment_vectors in self._segments])
            live = ~np.isin(ids, self._removed)
            self._added = (ids[live], vectors[live])
        return self._added

    @property
    def vectors_exact(self) -> bool:
        """Whether item vectors read back are the ones added (False: decoded PQ codes)."""
        return self._store.exact

    def vectors_of(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """float32 [len(ids), D]: the vectors of the items ``ids`` (all in the gallery)."""
        return self._store.vectors_of(np.asarray(ids, dtype=np.int64))

    def vector_rows(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """:meth:`vectors_of` for many items: in RAM within the gallery's memory budget, else
        a memory map of an unlinked temporary file (index.vector_store)."""
        return self._store.rows(np.asarray(ids, dtype=np.int64))

    def search(
        self,
        vectors: np.ndarray,
        k: int,
        *,
        ids: np.ndarray | Sequence[int] | None = None,
        exclude: np.ndarray | Sequence[int] | None = None,
        info: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query vector [Q, D]: (distances [Q, k'] float32,
        ids [Q, k'] int64), nearest first, k' = min(k, len(gallery)). Distance: Euclidean
        between unit vectors (see the module docstring). An approximate index may find fewer
        than k' neighbours: the missing ones have id -1 and distance inf.

        ``ids``: search only these items (a filter, see :meth:`filter_ids`), on every index
        type: k' = min(k, allowed items), all of them allowed; the true top-k of the allowed
        items for flat and for a filter allowing few items (searched exactly over them), as
        good as an unfiltered search for the other index types; exact distances except in a
        PQ gallery of codes only (index.ann.filtered).

        ``exclude``: per query, an item id left out of its answer. ``info``: filled, for a
        filtered search, with how many queries went exactly and through the index, and
        ``notes`` (e.g. a recall target the search cannot promise). Re-ranking, and the check
        of a caller's ``k``, are the search route's (nearsight.search.route)."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise NearsightError(f"k must be a whole number of at least 1, got {k!r}")
        k = int(k)
        if info is not None:  # what a filtered search fills in (index.ann.filtered)
            info.update(exact=0, index=0, notes=[])
        if exclude is not None:  # one deeper, then each row without its excluded id
            distances, found = self.search(vectors, k + 1, ids=ids, info=info)
            found, distances = without_keys(np.asarray(exclude, np.int64), found, distances)
            return distances[:, :k], found[:, :k]
        queries = np.ascontiguousarray(np.asarray(vectors), dtype=np.float32)
        if queries.ndim == 1:
            queries = queries[None, :]
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise NearsightError(
                f"query vectors must have shape [Q, {self.dim}], got {tuple(queries.shape)}"
            )
        allowed = None
        if ids is not None:  # the live ones (self.ids is sorted): O(len(ids) log N)
            allowed = np.asarray(ids, dtype=np.int64).reshape(-1)
            if len(allowed) and not (np.diff(allowed) > 0).all():  # filter_ids' are sorted
                allowed = np.unique(allowed)
            if self.count and self.ids[-1] == self.count - 1 and self.ids[0] == 0:
                allowed = allowed[(allowed >= 0) & (allowed < self.count)]  # ids 0..N-1
            else:
                position = np.minimum(np.searchsorted(self.ids, allowed), max(0, self.count - 1))
                allowed = allowed[self.ids[position] == allowed] if self.count else allowed[:0]
        depth = min(k, self.count if allowed is None else len(allowed))
        if depth == 0 or len(queries) == 0:
            shape = (len(queries), depth)
            return np.zeros(shape, np.float32), np.zeros(shape, np.int64)
        inner, found = self._search.nearest(queries, depth, allowed, info)
        distances = unit_distance(inner)
        distances[found < 0] = np.inf
        return distances, found.astype(np.int64, copy=False)

    def filter_ids(self, filters: Sequence[Condition] | Sequence[str] | str) -> np.ndarray:
        """Sorted ids of the items meeting every filter (``KEY=VALUE``, ``KEY>=N``, ...;
        index.catalog.filters), for :meth:`search`'s ``ids``."""
        conditions = [
            f if isinstance(f, Condition) else parse_filter(f)
            for f in ([filters] if isinstance(filters, str) else filters)
        ]
        assert self._catalog is not None
        return gallery_payload.filter_ids(self._payload, self._catalog, conditions,
                                          self._column_types)  # fmt: skip

    def facets(self, filters=None, keys: Sequence[str] | None = None) -> dict[str, dict]:  # noqa: ANN001
        """Per column (``keys``, default every metadata column), each text or integer value's
        count among the items ``filters`` allow (as :meth:`filter_ids`'s; None: every item)."""
        allowed = None if not filters else self.filter_ids(filters)
        return gallery_payload.facets(
            self._payload, self.path, self.meta_keys(), list(self._column_types), allowed, keys
        )

    def facet_summary(
        self, allowed: np.ndarray | None, top: int = TOP_VALUES, bins: int = BINS
    ) -> Facets:
        """Value counts and ranges of the filterable columns over ``allowed`` (sorted ids;
        None: every item), from the payload index (index.catalog.facets)."""
        assert self._catalog is not None
        payload = self._payload or PayloadIndex(self._catalog.payload_snapshot(), None,
                                                np.zeros(0, np.int64))  # fmt: skip
        return column_facets(payload, allowed, self._column_types, top, bins)

    def filter_notes(self, filters: Sequence[Condition]) -> list[str]:
        """Notes on filter values no item holds (index.catalog.filter_notes)."""
        assert self._catalog is not None
        return gallery_payload.filter_notes(self._payload, self._catalog, filters,
                                            self._column_types)  # fmt: skip

    def class_names(self) -> dict[int, str]:
        """label -> class name for the labels that have one (read once per open gallery)."""
        assert self._catalog is not None
        return self._catalog.class_names()

    def item_with_bytes(self, sha256: str) -> int | None:
        """The id of an item whose file has these bytes (by sha256; the lowest such id), if
        any."""
        assert self._catalog is not None
        return self._catalog.ids_by_sha256([sha256]).get(sha256)

    def meta_keys(self) -> list[str]:
        """The names of the items' extra columns (metadata), sorted."""
        assert self._catalog is not None
        if self._payload is not None:
            return self._payload.meta_keys()
        return self._catalog.meta_keys()

    def column_types(self) -> dict[str, str]:
        """Each metadata column's type (``int``, ``float``, ``str``, ``date``, ``datetime``)."""
        return dict(self._column_types)

    def items(self, ids: Iterable[int]) -> list[dict[str, Any]]:
        """Catalog rows of ``ids``, in the order given; GalleryError for an unknown id."""
        wanted = [int(i) for i in ids]
        assert self._catalog is not None
        rows = {row["id"]: row for row in self._catalog.items(wanted)}
        missing = [i for i in wanted if i not in rows]
        if missing:
            raise GalleryError(f"gallery {self.path} has no item with id {missing[0]}")
        return [dict(rows[i]) for i in wanted]

    def all_items(self) -> list[dict[str, Any]]:
        assert self._catalog is not None
        return self._catalog.items()

    # -- writing (nearsight/index/gallery/change.py) --------------------------------------------

    def add(self, vectors: np.ndarray, items: Sequence[dict[str, Any]]) -> list[int]:
        """Add ``items`` (catalog rows without ids) with their L2-normalised ``vectors``;
        returns their new ids (never an id the gallery held before). Writes one segment file
        and one catalog transaction (nearsight/index/gallery/segments.py), not the gallery."""
        return gallery_change.add(self, vectors, items)

    def remove(self, ids: Iterable[int]) -> None:
        """Remove the items ``ids`` (all must exist, else nothing changes): one catalog
        transaction; the index drops them when opened, compaction for good (at once for HNSW,
        whose graph cannot drop points; meanwhile its searches skip them)."""
        gallery_change.remove(self, ids)

    def compact(self, neighbour_graph: bool | None = None) -> None:
        """Fold the segments and removals into a new base index and embeddings (a whole,
        copy-on-write rewrite of the gallery); ``neighbour_graph``: add (True) or drop (False)
        the stored neighbour graph (default: rebuild it if there is one)."""
        gallery_change.compact(self, neighbour_graph)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    def __enter__(self) -> Gallery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
