"""Writing a gallery: building it whole, appending segments, removing items, compacting.

A gallery is built whole into a temporary folder beside ``GALLERY`` and renamed into place
(:func:`nearsight.index.gallery.files.gallery_writer`). ``add`` writes one segment file (nearsight/index/gallery/segments.py)
and commits one catalog transaction; ``remove`` commits one catalog transaction; ``compact`` is
copy-on-write: it writes a new folder holding the updated catalog, index and embeddings, then
renames it. A crash (even SIGKILL) at any point leaves the previous gallery whole; the next
writer sweeps the hidden temporary folder or the unlisted segment it left. Writers are
serialised by an ``fcntl.flock`` on ``.GALLERY.lock`` beside the folder (nearsight/index/gallery/lock.py),
and a writer re-reads the gallery from disk once it holds the lock, so two concurrent ``add``
calls both land.

:class:`nearsight.index.gallery.core.Gallery`'s ``add``, ``remove`` and ``compact`` are the functions here.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import faiss
import numpy as np

from nearsight.core.atomic import recover_dir
from nearsight.core.errors import NearsightError
from nearsight.index.ann.faiss_index import (
    METRIC,
    PQ_TYPES,
    add_vectors,
    apply_search_parameters,
    make_index,
)
from nearsight.index.ann.filter_tuning import calibrate, tune_filters
from nearsight.index.ann.index_choice import parse_memory, resolve_index_type
from nearsight.index.ann.tuning import TARGET_RECALL, tune, tuning_sample
from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.store import CATALOG_FILE, Catalog, GalleryError
from nearsight.index.gallery.files import (
    EMBEDDINGS_FILE,
    GALLERY_FILES,
    INDEX_FILE,
    check_consistent,
    gallery_writer,
)
from nearsight.index.gallery.graph import GRAPH_FILES, GRAPH_VERSION, compute_graph, write_graph
from nearsight.index.gallery.lock import gallery_lock, sweep_temporaries
from nearsight.index.gallery.payload import write_payload_into
from nearsight.index.gallery.segments import sweep_unlisted, write_segment
from nearsight.index.vector_store import describe_source, keep_embeddings


class Gallery(Protocol):
    """What the writers use of a gallery (nearsight.index.gallery.core's, which imports this
    module): its folder, width and index type, and a re-read of the folder after a write."""

    path: Path
    dim: int
    index_type: str
    meta: dict[str, Any]
    ids: np.ndarray
    _base: tuple[np.ndarray, np.ndarray | None]  # (base ids, embeddings.npy or None)
    _segments: list[tuple[np.ndarray, np.ndarray]]  # (ids, vectors) of each added segment
    _removed: np.ndarray
    _index: faiss.Index

    def __init__(self, path: Path) -> None: ...

    def __len__(self) -> int: ...

    @property
    def embeddings(self) -> np.ndarray: ...

    @property
    def embeddings_kept(self) -> bool: ...

    def vector_rows(self, ids: np.ndarray | Sequence[int]) -> np.ndarray: ...

    def close(self) -> None: ...

    def _load(self, *, locked: bool = False) -> None: ...


UNIT_NORM_TOLERANCE = 1e-3
# add compacts once the segments hold more than this many items and this share of the base:
# appends stay O(added items) and a gallery of N items is rewritten after ~N/4 appended items
COMPACT_MIN_ITEMS = 100_000
COMPACT_SHARE = 0.25
CHECK_BLOCK_ROWS = 1 << 16  # vectors checked at a time (finite, unit norm)


# -- building --------------------------------------------------------------------------------


def _check_vectors(vectors: np.ndarray, count: int, dim: int | None = None) -> np.ndarray:
    array = np.ascontiguousarray(np.asarray(vectors), dtype=np.float32)
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"vectors must be a 2-D array [N, D], got shape {array.shape}")
    if len(array) != count:
        raise ValueError(f"{len(array)} vectors for {count} items")
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"vectors have dim {array.shape[1]}, the gallery has dim {dim}")
    # in blocks: a whole-array check makes temporaries of the array's size (5 GB at 10M x 128)
    for start in range(0, len(array), CHECK_BLOCK_ROWS):
        block = array[start : start + CHECK_BLOCK_ROWS]
        if not np.isfinite(block).all():
            raise ValueError("vectors contain NaN or infinite values")
        norms = np.sqrt(np.einsum("ij,ij->i", block, block))
        if np.abs(norms - 1.0).max() > UNIT_NORM_TOLERANCE:
            raise ValueError("vectors must be L2-normalised (the embedder's output is)")
    return array


def write_gallery(
    out_dir: str | os.PathLike[str],
    vectors: np.ndarray,
    items: Sequence[dict[str, Any]],
    *,
    model_sha256: str,
    index_type: str = "auto",
    meta: dict[str, Any] | None = None,
    max_index_memory: str | int | None = None,
    target_recall: float = TARGET_RECALL,
    embeddings: str = "auto",
    vector_source: str | os.PathLike[str] | None = None,
    neighbour_graph: bool = False,
) -> Path:
    """Write a new gallery folder at ``out_dir`` (replacing a gallery there) holding ``items``
    (catalog rows without ids: path, label, class_name, split, sha256, width, height) and their
    L2-normalised ``vectors`` [N, D]; ids are 0..N-1. ``meta`` adds to the catalog meta (model
    path, image size, dataset...). ``auto`` chooses the index type by count and
    ``max_index_memory`` (index.index_choice); an approximate index's nprobe/efSearch is tuned
    to ``target_recall`` recall@10 (index.ann.tuning). ``embeddings``: keep, drop or (auto) drop
    embeddings.npy past the budget when exact vectors remain without it (index.vector_store);
    ``vector_source``: the .npy file or chunk folder ``vectors`` were read from (row i = id i),
    recorded for a PQ gallery without embeddings.npy as its exact vectors.
    ``neighbour_graph``: also store each item's nearest items (nearsight/index/gallery/graph.py,
    for fast database-side augmentation). Returns the folder."""
    if not items:
        raise NearsightError("cannot build a gallery of no images")
    array = _check_vectors(vectors, len(items))
    budget = parse_memory(max_index_memory)
    resolved = resolve_index_type(index_type, len(array), array.shape[1], budget)
    count, dim = array.shape
    keep = keep_embeddings(embeddings, count, dim, resolved, budget, vector_source is not None)
    source = None
    if not keep and vector_source is not None and resolved in PQ_TYPES:
        source = describe_source(vector_source)
    ids = np.arange(len(array), dtype=np.int64)
    final = Path(out_dir).expanduser().absolute()
    with gallery_lock(final, exclusive=True), _write_errors(final):
        sweep_temporaries(final)
        with gallery_writer(final) as tmp:
            rerank = keep or source is not None  # PQ searches re-rank by exact vectors
            index, params = _index_in_build_order(
                array, ids, resolved, target_recall=target_recall, rerank=rerank
            )
            root = common_folder(items)  # fixed now: how a server names the items later
            full_meta = {
                **({"root": root} if root else {}),
                **(meta or {}),
                "model_sha256": model_sha256,
                "dim": dim,
                "metric": METRIC,
                "index_type": resolved,
                "count": count,
                "memory_budget": budget,
                "embeddings_kept": keep,
                **({"vector_source": source} if source else {}),
                **({"neighbour_graph": GRAPH_VERSION} if neighbour_graph else {}),
                **params,
            }
            rows = [{**item, "id": int(i)} for i, item in zip(ids, items, strict=True)]
            create_catalog(tmp / CATALOG_FILE, rows, full_meta)
            write_payload_into(tmp)
            _write_arrays(tmp, index, array if keep else None)
            if neighbour_graph:
                _write_graph(tmp, index, full_meta, array, ids)
    return final


def common_folder(items: Sequence[dict[str, Any]]) -> str | None:
    """The deepest folder holding every item's file, when all paths are absolute and share
    one below the file system's root (else None)."""
    paths = [str(item.get("path") or "") for item in items]
    if not paths or not all(os.path.isabs(path) for path in paths):
        return None
    folder = os.path.commonpath([os.path.dirname(path) for path in paths])
    return folder if folder != os.path.dirname(folder) else None


def _index_in_build_order(
    vectors: np.ndarray,
    ids: np.ndarray,
    index_type: str,
    *,
    target_recall: float | None = None,
    rerank: bool = True,
) -> tuple[faiss.Index, dict[str, Any]]:
    """The index in the one insertion order every build uses: all vectors but index.ann.tuning's
    held-out sample, then the sample, after nprobe/efSearch were tuned on it to
    ``target_recall`` (None: not tuned). Returns the index and its meta parameters."""
    held_out = tuning_sample(len(ids), index_type)
    index, params = make_index(vectors, ids, index_type, skip=held_out)
    route: dict[str, Any] = {}
    if target_recall is not None:
        params.update(
            tune(index, index_type, vectors, ids, target_recall, rerank=rerank, held_out=held_out)
        )
        if rerank:  # filtered searches of a codes-only gallery promise nothing (filtered.py)
            # to the filtered search's own target (filter_plan.TARGET_RECALL)
            route = tune_filters(index, index_type, {"index_type": index_type, **params},
                                 vectors, ids, held_out)  # fmt: skip
    add_vectors(index, vectors[held_out], ids[held_out])
    if route:  # this machine's costs, timed on the whole index
        costs = calibrate(index, index_type, {**params, "filter_route": route}, ids,
                          lambda wanted: vectors[wanted], lambda wanted: (vectors, wanted))  # fmt: skip
        params["filter_route"] = {**route, "costs": costs.as_meta()}
    return index, params


def _write_arrays(folder: Path, index: faiss.Index, embeddings: np.ndarray | None) -> None:
    """Write index.faiss and (unless None) embeddings.npy into the temporary folder."""
    try:
        faiss.write_index(index, str(folder / INDEX_FILE))
    except RuntimeError as error:  # how faiss reports a failed write (a full disk)
        raise OSError(str(error).split("failed: ", 1)[-1]) from None
    if embeddings is not None:
        np.save(folder / EMBEDDINGS_FILE, np.ascontiguousarray(embeddings, dtype=np.float32))
    for name in GALLERY_FILES:  # on disk before the rename makes them the gallery
        if name == EMBEDDINGS_FILE and embeddings is None:
            continue
        with open(folder / name, "rb") as handle:
            os.fsync(handle.fileno())


def _write_graph(
    folder: Path, index: faiss.Index, meta: dict[str, Any], vectors: np.ndarray, ids: np.ndarray
) -> None:
    """The neighbour graph of the base index's items into the temporary folder."""
    apply_search_parameters(index, meta)  # the tuned nprobe / efSearch
    search = getattr(index, "search_numpy", index.search)  # see Gallery._search_raw
    neighbours, sims = compute_graph(search, vectors, ids)
    write_graph(folder, neighbours, sims)
    for name in GRAPH_FILES:
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


# -- changing an open gallery ----------------------------------------------------------------


def add(gallery: Gallery, vectors: np.ndarray, items: Sequence[dict[str, Any]]) -> list[int]:
    """:meth:`Gallery.add <nearsight.index.gallery.core.Gallery.add>`: one segment file and one catalog
    transaction, then ``gallery`` is reloaded (or compacted, past the thresholds above)."""
    if not items:
        return []
    array = _check_vectors(vectors, len(items), gallery.dim)
    folder = gallery.path
    with _writing(gallery) as (current, catalog):
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
        compact(gallery)
    else:
        gallery._load()
    return new_ids


def remove(gallery: Gallery, ids: Iterable[int]) -> None:
    """:meth:`Gallery.remove <nearsight.index.gallery.core.Gallery.remove>`: one catalog transaction (HNSW
    compacts at once)."""
    wanted = sorted({int(i) for i in ids})
    if not wanted:
        return
    folder = gallery.path
    with _writing(gallery) as (current, catalog):
        unknown = np.setdiff1d(wanted, current.ids)
        if len(unknown):
            shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
            raise GalleryError(f"gallery {folder} has no item with id {shown}")
        removed = np.union1d(current._removed, wanted)
        catalog.remove(
            wanted, meta={"removed": removed.tolist(), "count": len(current) - len(wanted)}
        )
    if gallery.index_type == "hnsw":  # HNSW cannot drop points from its graph: rebuild it
        compact(gallery)
    else:
        gallery._load()


def compact(gallery: Gallery, neighbour_graph: bool | None = None) -> None:
    """Fold the segments and removals into a new base index and embeddings (a whole,
    copy-on-write rewrite of the gallery); the neighbour graph is rebuilt when the gallery has
    one. ``neighbour_graph``: True adds one, False drops it."""

    def change(catalog: Catalog, current: Gallery):
        if neighbour_graph is not None:
            catalog.set_meta(neighbour_graph=GRAPH_VERSION if neighbour_graph else None)
        # a gallery without embeddings.npy stays without (its vectors: the index, the source)
        embeddings = current.embeddings if current.embeddings_kept else None
        index = current._index  # segments added, removed ids dropped (not for HNSW)
        if current.index_type == "hnsw" and len(current._removed):
            # a fresh build's insertion order, so the same vectors give the same graph
            index, _ = _index_in_build_order(current.embeddings, current.ids, "hnsw")
        catalog.set_meta(segments=[], removed=[])
        return index, embeddings

    _rewrite(gallery, change)


def _on_disk(gallery: Gallery) -> Gallery:
    """The gallery as it is on disk now, with what other writers added; the caller holds the
    write lock."""
    current = type(gallery)(gallery.path)
    current._load(locked=True)
    return current


@contextlib.contextmanager
def _writing(gallery: Gallery) -> Iterator[tuple[Gallery, Catalog]]:
    """Under the write lock: the gallery as on disk now (with what other writers added)
    and its catalog open for writing; stray segments of killed writers are swept."""
    folder = gallery.path
    with gallery_lock(folder, exclusive=True), _write_errors(folder):
        recover_dir(folder)
        sweep_temporaries(folder)
        current = _on_disk(gallery)
        catalog = None
        try:
            sweep_unlisted(folder, list(current.meta.get("segments", [])))
            catalog = Catalog.open(folder / CATALOG_FILE)
            yield current, catalog
        finally:
            if catalog is not None:
                catalog.close()
            current.close()


def _rewrite(gallery: Gallery, change) -> None:
    """Copy-on-write under the write lock: read the gallery as it is on disk now, apply
    ``change`` to copies in a temporary folder, check them, rename the folder into place."""
    folder = gallery.path
    with gallery_lock(folder, exclusive=True):
        recover_dir(folder)
        sweep_temporaries(folder)
        current = _on_disk(gallery)
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
                check_consistent(folder, meta, ids, index, embeddings, [], ids[:0])
                write_payload_into(tmp)
                _write_arrays(tmp, index, embeddings)
                if meta.get("neighbour_graph"):
                    vectors = current.vector_rows(ids) if embeddings is None else embeddings
                    _write_graph(tmp, index, meta, np.asarray(vectors), ids)
        finally:
            current.close()
    gallery._load()


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


def set_meta(gallery: Gallery, **values: Any) -> None:
    """Store ``values`` in the gallery's catalog meta (one transaction under the write lock),
    e.g. the re-ranking chosen by ``nearsight eval --tune-on VAL --save``."""
    with _writing(gallery) as (_, catalog):
        catalog.set_meta(**values)
    gallery._load()
