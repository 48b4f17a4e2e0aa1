"""The gallery: a folder holding a catalog, a FAISS index and the embeddings, always consistent.

Layout (DESIGN.md)::

    GALLERY/catalog.db      items (id = FAISS id, path, label, ...) and meta (index.catalog)
    GALLERY/index.faiss     the CPU FAISS index; its ids are the catalog ids
    GALLERY/embeddings.npy  float32 [N, D], L2-normalised, row i = the i-th catalog id in order

Writing. A gallery is written whole into a temporary folder beside ``GALLERY`` and renamed into
place (:func:`index.catalog.gallery_writer`). ``add`` and ``remove`` are copy-on-write: they
write a new folder holding the updated catalog, index and embeddings, then rename it. A crash
(even SIGKILL) at any point leaves the previous gallery whole; the next writer sweeps the
hidden temporary folder it left. Writers are serialised by an ``fcntl.flock`` on
``.GALLERY.lock`` beside the folder (never deleted, so every writer locks the same file), and a
writer re-reads the gallery from disk once it holds the lock, so two concurrent ``add`` calls
both land. Readers take the lock shared while they load, so they never see the instant between
the two renames of a replace.

Index types, their parameters and the distance reported: index/faiss_index.py. Locking and
recovery after a killed writer: index/gallery_lock.py.

The parameters are stored in the catalog meta (``nlist``, ``nprobe``, ``hnsw_m``,
``ef_construction``, ``ef_search``). With a GPU (``faiss.get_num_gpus() > 0``) flat and IVF
indexes are searched on it; the file is always the CPU index.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import faiss
import numpy as np
from PIL import Image

from nearsight.index.catalog import (
    CATALOG_FILE,
    Catalog,
    GalleryError,
    create_catalog,
    gallery_writer,
)
from nearsight.index.faiss_index import (  # noqa: F401  (re-exported: the gallery's public names)
    HNSW_EF_SEARCH,
    INDEX_TYPES,
    METRIC,
    PQ_TYPES,
    apply_search_parameters,
    index_ids,
    ivf_parameters,
    make_index,
    read_index,
    resolve_index_type,
    to_gpu,
    unit_distance,
)
from nearsight.index.gallery_lock import (  # noqa: F401  (lock_path re-exported)
    gallery_lock,
    lock_path,
    previous_path,
    recover,
    sweep_temporaries,
)
from nearsight.index.images import file_sha256
from nearsight.index.index_choice import FLAT_MAX_ITEMS, parse_memory  # noqa: F401
from nearsight.index.metrics import CUB_KS, SOP_KS, default_ks, evaluate
from nearsight.index.segments import read_segment, sweep_unlisted, write_segment
from nearsight.index.tuning import REFINE_FACTOR, TARGET_RECALL, refine, tune
from nearsight.models.atomic import recover_dir
from nearsight.models.errors import NearsightError

INDEX_FILE = "index.faiss"
EMBEDDINGS_FILE = "embeddings.npy"
GALLERY_FILES = (CATALOG_FILE, INDEX_FILE, EMBEDDINGS_FILE)
UNIT_NORM_TOLERANCE = 1e-3
# NMI's k-means++ seeding is O(N k); past this many classes use faiss's AFK-MC2 approximation
EXACT_KMEANSPP_MAX_CLASSES = 1000
_EXIF_ORIENTATION = 0x0112
# add compacts once the segments hold more than this many items and this share of the base:
# appends stay O(added items) and a gallery of N items is rewritten after ~N/4 appended items
COMPACT_MIN_ITEMS = 100_000
COMPACT_SHARE = 0.25
MMAP_MIN_BYTES = 1 << 30  # an index file this large is memory-mapped where FAISS can


# -- building --------------------------------------------------------------------------------


def _check_vectors(vectors: np.ndarray, count: int, dim: int | None = None) -> np.ndarray:
    array = np.ascontiguousarray(np.asarray(vectors), dtype=np.float32)
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"vectors must be a 2-D array [N, D], got shape {array.shape}")
    if len(array) != count:
        raise ValueError(f"{len(array)} vectors for {count} items")
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"vectors have dim {array.shape[1]}, the gallery has dim {dim}")
    if not np.isfinite(array).all():
        raise ValueError("vectors contain NaN or infinite values")
    norms = np.linalg.norm(array, axis=1)
    if len(norms) and np.abs(norms - 1.0).max() > UNIT_NORM_TOLERANCE:
        raise ValueError("vectors must be L2-normalised (the embedder's output is)")
    return array


def build_gallery(
    out_dir: str | os.PathLike[str],
    vectors: np.ndarray,
    items: Sequence[dict[str, Any]],
    *,
    model_sha256: str,
    index_type: str = "auto",
    meta: dict[str, Any] | None = None,
    max_index_memory: str | int | None = None,
    target_recall: float = TARGET_RECALL,
) -> Path:
    """Write a new gallery folder at ``out_dir`` (replacing a gallery there) holding ``items``
    (catalog rows without ids: path, label, class_name, split, sha256, width, height) and their
    L2-normalised ``vectors`` [N, D]; ids are 0..N-1. ``meta`` adds to the catalog meta (model
    path, image size, dataset...). ``auto`` chooses the index type by count and
    ``max_index_memory`` (index.index_choice); an approximate index's nprobe/efSearch is tuned
    to ``target_recall`` recall@10 (index.tuning). Returns the folder."""
    if not items:
        raise NearsightError("cannot build a gallery of no images")
    array = _check_vectors(vectors, len(items))
    budget = parse_memory(max_index_memory)
    resolved = resolve_index_type(index_type, len(array), array.shape[1], budget)
    ids = np.arange(len(array), dtype=np.int64)
    final = Path(out_dir).expanduser().absolute()
    with gallery_lock(final, exclusive=True), _write_errors(final):
        sweep_temporaries(final)
        with gallery_writer(final) as tmp:
            index, params = make_index(array, ids, resolved)
            params.update(tune(index, resolved, array, ids, target_recall))
            full_meta = {
                **(meta or {}),
                "model_sha256": model_sha256,
                "dim": int(array.shape[1]),
                "metric": METRIC,
                "index_type": resolved,
                "count": len(array),
                **params,
            }
            rows = [{**item, "id": int(i)} for i, item in zip(ids, items, strict=True)]
            create_catalog(tmp / CATALOG_FILE, rows, full_meta)
            _write_arrays(tmp, index, array)
    return final


def _write_arrays(folder: Path, index: faiss.Index, embeddings: np.ndarray) -> None:
    try:
        faiss.write_index(index, str(folder / INDEX_FILE))
    except RuntimeError as error:  # how faiss reports a failed write (a full disk)
        raise OSError(str(error).split("failed: ", 1)[-1]) from None
    np.save(folder / EMBEDDINGS_FILE, np.ascontiguousarray(embeddings, dtype=np.float32))
    for name in GALLERY_FILES:  # on disk before the rename makes them the gallery
        with open(folder / name, "rb") as handle:
            os.fsync(handle.fileno())


def _write_segment(folder: Path, ids: np.ndarray, vectors: np.ndarray) -> str:
    return write_segment(folder, ids, vectors)  # one name to patch in fault tests


@contextlib.contextmanager
def _write_errors(folder: Path) -> Iterator[None]:
    """A write that fails for a reason outside nearsight (a full disk, a quota, a read-only
    folder) becomes an OSError naming the gallery (SQLite's and numpy's own messages name
    neither the file nor the gallery). gallery_writer has removed its temporary folder by
    then: the previous gallery is untouched."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise OSError(f"cannot write gallery {folder}: {reason}") from None


def describe_image_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Catalog fields of an image file: sha256 of its bytes, and width/height as loaded (EXIF
    orientation applied). Fields that cannot be read are None (the image was already decoded
    once by the embedder, so this does not judge it)."""
    info: dict[str, Any] = {"sha256": None, "width": None, "height": None}
    with contextlib.suppress(NearsightError):
        info["sha256"] = file_sha256(path)
    with contextlib.suppress(Exception), Image.open(path) as image:  # reads the header only
        width, height = image.size
        # EXIF orientations 5-8 turn the image a quarter: load_image gives height x width
        if image.getexif().get(_EXIF_ORIENTATION, 1) in (5, 6, 7, 8):
            width, height = height, width
        info["width"], info["height"] = int(width), int(height)
    return info


# -- the open gallery ------------------------------------------------------------------------


class Gallery:
    """An open gallery: catalog, index and embeddings, checked to agree. Use :meth:`open`.

    The object is a snapshot: ``add`` and ``remove`` rewrite the folder and refresh this object;
    changes made by other processes are seen after :meth:`reload`. Searching from several
    threads at once is safe."""

    def __init__(self, path: Path):
        self.path = path
        self._catalog: Catalog | None = None
        self._gpu_lock = threading.Lock()

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, gallery_dir: str | os.PathLike[str], *, model: Any = None) -> Gallery:
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
        folder = self.path
        if not locked:
            # plain mistakes are reported before a lock file is made beside the folder
            if not folder.exists() and not previous_path(folder).exists():
                raise GalleryError(f"no gallery at {folder}")
            if folder.is_dir() and not (folder / CATALOG_FILE).exists():
                raise GalleryError(f"not a nearsight gallery: {folder} has no {CATALOG_FILE}")
            if folder.exists() and not folder.is_dir():
                raise GalleryError(f"not a nearsight gallery: {folder} is a file, not a folder")
            recover(folder)
        reading = contextlib.nullcontext() if locked else gallery_lock(folder, exclusive=False)
        with reading:  # under the lock: a writer may be between the two renames of a replace
            if not folder.exists():
                raise GalleryError(f"no gallery at {folder}")
            if not folder.is_dir():
                raise GalleryError(f"not a nearsight gallery: {folder} is a file, not a folder")
            if not (folder / CATALOG_FILE).is_file():
                raise GalleryError(f"not a nearsight gallery: {folder} has no {CATALOG_FILE}")
            for name in (INDEX_FILE, EMBEDDINGS_FILE):
                if not (folder / name).is_file():
                    raise GalleryError(f"gallery {folder} is incomplete: it has no {name}")
            catalog = Catalog.open(folder / CATALOG_FILE, readonly=True)
            try:
                ids, labels = catalog.labels()
                meta = catalog.meta()
                pending = meta.get("segments") or meta.get("removed")
                mappable = (folder / INDEX_FILE).stat().st_size >= MMAP_MIN_BYTES
                index = read_index(folder / INDEX_FILE, mmap=mappable and not pending)
                embeddings = _read_embeddings(folder / EMBEDDINGS_FILE)
                dim = int(meta.get("dim", index.d))
                segments = [read_segment(folder, name, dim) for name in meta.get("segments", [])]
                removed = np.sort(np.asarray(meta.get("removed", []), dtype=np.int64))
                base_ids = _check_consistent(
                    folder, meta, ids, index, embeddings, segments, removed
                )
            except BaseException:
                catalog.close()
                raise
        self.close()
        self._catalog = catalog
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
        self._embeddings: np.ndarray | None = None
        for segment_ids, segment_vectors in segments:
            index.add_with_ids(segment_vectors, segment_ids)
        self._excluded = None  # HNSW cannot remove points: its searches skip removed ids
        if len(removed) and self.index_type == "hnsw":
            batch = faiss.IDSelectorBatch(removed)
            self._excluded = faiss.IDSelectorNot(batch)
            self._excluded.referenced_objects = [batch]  # the SWIG wrapper does not keep it
        elif len(removed):
            index.remove_ids(removed)
        self._index = index
        apply_search_parameters(index, meta)
        # a writer's private read (locked) is never searched: no GPU copy for it
        self._gpu_index = None if locked else to_gpu(index, self.index_type)

    def model_path(self, override: str | os.PathLike[str] | None = None) -> Path:
        """The model to embed queries with: ``override``, else the one the gallery records
        (one-line NearsightError when it records none or the file is gone)."""
        if override is not None:
            return Path(override)
        recorded = self.meta.get("model")
        if not recorded and not self.model_sha256:
            raise NearsightError(
                f"gallery {self.path} was imported without a model: search it by --id or "
                f"--vector, or pass --model (a model of dim {self.dim}) to search by image"
            )
        if not recorded:
            raise NearsightError(f"gallery {self.path} does not record its model: pass --model")
        path = Path(str(recorded))
        if not path.is_file():
            raise NearsightError(
                f"the model gallery {self.path} was built with is not at {path} any more: "
                "pass --model"
            )
        return path

    def check_model(self, model: Any, name: str | os.PathLike[str] | None = None) -> None:
        """GalleryError unless ``model`` (``dim``, ``model_sha256``) is the gallery's model."""
        model_dim = int(model.dim)
        model_sha = str(model.model_sha256)
        if model_dim == self.dim and model_sha == self.model_sha256:
            return
        if model_dim == self.dim and not self.model_sha256:
            return  # imported vectors of an unrecorded model: the dim is all there is to check
        label = os.fspath(name) if name is not None else getattr(model, "path", None) or "MODEL"
        raise GalleryError(
            f"gallery {self.path} was built with model sha256 {self.model_sha256[:12]}.. "
            f"(dim {self.dim}) but {label} is {model_sha[:12]}.. (dim {model_dim}): rebuild the "
            "gallery or pass the model it was built with"
        )

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def embeddings(self) -> np.ndarray:
        """float32 [N, D]; row i is the vector of ``ids[i]``. Without segments or removals,
        the memory-mapped embeddings.npy itself; else assembled once, on first use."""
        if self._embeddings is None:
            base_ids, base = self._base
            if not self._segments and not len(self._removed):
                self._embeddings = base
            else:
                all_ids = np.concatenate([base_ids, *(ids for ids, _ in self._segments)])
                rows = np.concatenate([np.asarray(base), *(v for _, v in self._segments)])
                keep = ~np.isin(all_ids, self._removed)
                self._embeddings = rows if keep.all() else np.ascontiguousarray(rows[keep])
        return self._embeddings

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query vector [Q, D]: (distances [Q, k'] float32,
        ids [Q, k'] int64), nearest first, k' = min(k, len(gallery)). Distance: Euclidean
        between unit vectors (see the module docstring). An approximate index may find fewer
        than k' neighbours: the missing ones have id -1 and distance inf."""
        if k < 1:
            raise NearsightError(f"k must be a positive integer, got {k}")
        queries = np.ascontiguousarray(np.asarray(vectors), dtype=np.float32)
        if queries.ndim == 1:
            queries = queries[None, :]
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise NearsightError(
                f"query vectors must have shape [Q, {self.dim}], got {tuple(queries.shape)}"
            )
        depth = min(k, self.count)
        if depth == 0 or len(queries) == 0:
            shape = (len(queries), depth)
            return np.zeros(shape, np.float32), np.zeros(shape, np.int64)
        inner, ids = self._search_index(queries, depth)
        distances = unit_distance(inner)
        distances[ids < 0] = np.inf
        return distances, ids.astype(np.int64, copy=False)

    def _search_index(self, queries: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        if self.index_type not in PQ_TYPES:
            return self._search_raw(queries, depth)
        # compressed codes rank roughly: re-rank more candidates by the exact vectors
        _, candidates = self._search_raw(queries, min(self.count, depth * REFINE_FACTOR))
        embeddings, ids = self.embeddings, self.ids
        return refine(
            queries, candidates, lambda wanted: embeddings[np.searchsorted(ids, wanted)], depth
        )

    def _search_raw(self, queries: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        if self._gpu_index is not None and depth <= 2048:  # GPU k-selection limit
            with self._gpu_lock:
                return self._gpu_index.search(queries, depth)
        if self.index_type == "hnsw":
            ef = max(int(self.meta.get("ef_search", HNSW_EF_SEARCH)), depth)
            # faiss.contrib.torch_utils (imported by pytorch-metric-learning's
            # AccuracyCalculator) replaces Index.search with a wrapper that has no `params`;
            # it keeps the original as search_numpy
            search = getattr(self._index, "search_numpy", self._index.search)
            params = faiss.SearchParametersHNSW(efSearch=ef)
            if self._excluded is not None:
                params.sel = self._excluded
            return search(queries, depth, params=params)
        return self._index.search(queries, depth)

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

    def default_ks(self) -> tuple[int, ...]:
        """The papers' k values: SOP's for a gallery of the sop dataset, CUB/CARS's for other
        datasets, by size for a gallery of loose images."""
        dataset = self.meta.get("dataset")
        if dataset == "sop":
            return SOP_KS
        if dataset:
            return CUB_KS
        return default_ks(int((self.labels >= 0).sum()))

    def evaluate(self, ks: Sequence[int] | None = None) -> dict[str, float | int]:
        """The papers' protocol on the stored embeddings: every labelled item queries all the
        other labelled items (unlabelled ones are left out). Returns index.metrics.evaluate's
        dict: recall@k..., nmi, map@r, queries."""
        labelled = self.labels >= 0
        if labelled.sum() < 2:
            raise NearsightError(
                f"gallery {self.path} has {int(labelled.sum())} labelled items: evaluation needs "
                "at least 2"
            )
        vectors = np.asarray(self.embeddings)
        labels = self.labels
        if not labelled.all():
            vectors, labels = vectors[labelled], labels[labelled]
        classes = len(np.unique(labels))
        init = "k-means++" if classes <= EXACT_KMEANSPP_MAX_CLASSES else "afk-mc2"
        return evaluate(vectors, labels, tuple(ks or self.default_ks()), nmi_init=init)

    # -- writing -----------------------------------------------------------------------------

    def add(self, vectors: np.ndarray, items: Sequence[dict[str, Any]]) -> list[int]:
        """Add ``items`` (catalog rows without ids) with their L2-normalised ``vectors``;
        returns their new ids (never an id the gallery held before). Writes one segment file
        and one catalog transaction (index/segments.py), not the gallery."""
        if not items:
            return []
        array = _check_vectors(vectors, len(items), self.dim)
        folder = self.path
        with self._writing() as (current, catalog):
            first = catalog.next_id()
            ids = np.arange(first, first + len(array), dtype=np.int64)
            name = _write_segment(folder, ids, array)
            try:
                new_ids = catalog.add_items(
                    [dict(item) for item in items],
                    meta={
                        "segments": [*current.meta.get("segments", []), name],
                        "count": len(current) + len(array),
                    },
                )
            except BaseException:
                (folder / name).unlink(missing_ok=True)
                raise
            assert new_ids == ids.tolist()
            pending = sum(len(segment_ids) for segment_ids, _ in current._segments) + len(array)
            base = len(current._base[0])
        if pending > max(COMPACT_MIN_ITEMS, base * COMPACT_SHARE):
            self.compact()
        else:
            self._load()
        return new_ids

    def remove(self, ids: Iterable[int]) -> None:
        """Remove the items ``ids`` (all must exist, else nothing changes): one catalog
        transaction; the index drops them when opened, compaction for good (at once for HNSW,
        whose graph cannot drop points; meanwhile its searches skip them)."""
        wanted = sorted({int(i) for i in ids})
        if not wanted:
            return
        folder = self.path
        with self._writing() as (current, catalog):
            unknown = np.setdiff1d(wanted, current.ids)
            if len(unknown):
                shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
                raise GalleryError(f"gallery {folder} has no item with id {shown}")
            removed = np.union1d(current._removed, wanted)
            catalog.remove(
                wanted, meta={"removed": removed.tolist(), "count": len(current) - len(wanted)}
            )
        if self.index_type == "hnsw":  # HNSW cannot drop points from its graph: rebuild it
            self.compact()
        else:
            self._load()

    def compact(self) -> None:
        """Fold the segments and removals into a new base index and embeddings (a whole,
        copy-on-write rewrite of the gallery)."""

        def change(catalog: Catalog, current: Gallery):
            embeddings = np.ascontiguousarray(current.embeddings)
            index = current._index  # segments added, removed ids dropped (not for HNSW)
            if current.index_type == "hnsw" and len(current._removed):
                index, _ = make_index(embeddings, current.ids, "hnsw")
            catalog.set_meta(segments=[], removed=[])
            return index, embeddings

        self._rewrite(change)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[tuple[Gallery, Catalog]]:
        """Under the write lock: the gallery as on disk now (with what other writers added)
        and its catalog open for writing; stray segments of killed writers are swept."""
        folder = self.path
        with gallery_lock(folder, exclusive=True), _write_errors(folder):
            recover_dir(folder)
            sweep_temporaries(folder)
            current = Gallery(folder)
            current._load(locked=True)
            catalog = None
            try:
                sweep_unlisted(folder, list(current.meta.get("segments", [])))
                catalog = Catalog.open(folder / CATALOG_FILE)
                yield current, catalog
            finally:
                if catalog is not None:
                    catalog.close()
                current.close()

    def _rewrite(self, change) -> None:
        """Copy-on-write under the write lock: read the gallery as it is on disk now, apply
        ``change`` to copies in a temporary folder, check them, rename the folder into place."""
        folder = self.path
        with gallery_lock(folder, exclusive=True):
            recover_dir(folder)
            sweep_temporaries(folder)
            current = Gallery(folder)
            current._load(locked=True)  # what is on disk now, with what other writers added
            try:
                with _write_errors(folder), gallery_writer(folder) as tmp:
                    _copy_catalog(folder / CATALOG_FILE, tmp / CATALOG_FILE)
                    catalog = Catalog.open(tmp / CATALOG_FILE)
                    try:
                        # current's index is changed in place: current is thrown away after
                        index, embeddings = change(catalog, current)
                        ids, _ = catalog.labels()
                        catalog.set_meta(count=len(ids))
                        meta = catalog.meta()
                    finally:
                        catalog.close()
                    _check_consistent(folder, meta, ids, index, embeddings, [], ids[:0])
                    _write_arrays(tmp, index, embeddings)
            finally:
                current.close()
        self._load()

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    def __enter__(self) -> Gallery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- internals -------------------------------------------------------------------------------


def _read_embeddings(path: Path) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise GalleryError(f"{path} is not a readable embeddings file ({error})") from None
    if array.ndim != 2 or array.dtype != np.float32:
        raise GalleryError(
            f"{path} should hold float32 [N, D] embeddings, it holds {array.dtype} "
            f"{tuple(array.shape)}"
        )
    return array


def _check_consistent(
    folder: Path,
    meta: dict,
    ids: np.ndarray,
    index: faiss.Index,
    embeddings: np.ndarray,
    segments: Sequence[tuple[np.ndarray, np.ndarray]],
    removed: np.ndarray,
) -> np.ndarray:
    """Check that the base index and embeddings agree, and that base + segments hold exactly
    the catalog's ids and the removed ones; returns the base ids, sorted."""
    missing = [key for key in ("model_sha256", "dim", "metric", "index_type") if key not in meta]
    if missing:
        raise GalleryError(f"gallery {folder} is damaged: its catalog meta has no '{missing[0]}'")
    if meta["metric"] != METRIC:
        raise GalleryError(f"gallery {folder} uses metric {meta['metric']!r}, not {METRIC!r}")
    dim = int(meta["dim"])
    if index.d != dim or embeddings.shape[1] != dim:
        raise GalleryError(
            f"gallery {folder} is inconsistent: catalog dim {dim}, index dim {index.d}, "
            f"embeddings dim {embeddings.shape[1]}"
        )
    added = sum(len(segment_ids) for segment_ids, _ in segments)
    count = len(ids)
    if index.ntotal + added != count + len(removed) or len(embeddings) != index.ntotal:
        raise GalleryError(
            f"gallery {folder} is inconsistent: {count} catalog items, {index.ntotal} index "
            f"vectors, {len(embeddings)} embeddings"
        )
    base_ids = np.sort(index_ids(index))
    held = np.concatenate([base_ids, *(segment_ids for segment_ids, _ in segments)])
    expected = np.union1d(ids, removed)  # ids is sorted (catalog order)
    if not np.array_equal(np.sort(held), expected):
        absent = np.setdiff1d(expected, held)
        shown = int(absent[0]) if len(absent) else int(np.setdiff1d(held, expected)[0])
        raise GalleryError(
            f"gallery {folder} is inconsistent: catalog and index ids differ (id {shown})"
        )
    return base_ids


def _copy_catalog(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite catalog (the backup API, not a file copy)."""
    uri = f"file:{quote(str(source))}?mode=ro"
    src = sqlite3.connect(uri, uri=True)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    except sqlite3.DatabaseError as error:
        raise GalleryError(f"gallery catalog {source} cannot be copied: {error}") from None
    finally:
        src.close()
