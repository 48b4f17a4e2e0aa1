"""Writing a gallery folder whole: :func:`write_gallery` and the pieces every writer shares.

A gallery is built whole into a temporary folder beside ``GALLERY`` and renamed into place
(:func:`nearsight.index.gallery.files.gallery_writer`), under the write lock
(nearsight/index/gallery/lock.py): a crash (even SIGKILL) at any point leaves the previous
gallery whole, and the next writer sweeps the hidden temporary folder it left. Changing an
open gallery (``add``, ``remove``, ``compact``): nearsight/index/gallery/change.py.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.ann import coarse
from nearsight.index.ann.faiss_index import (
    METRIC,
    PQ_TYPES,
    add_vectors,
    apply_search_parameters,
    make_index,
)
from nearsight.index.ann.filter_tuning import calibrate, partition_for, tune_filters
from nearsight.index.ann.index_choice import parse_memory, resolve_index_type
from nearsight.index.ann.tuning import TARGET_RECALL, tune, tuning_sample
from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.store import CATALOG_FILE
from nearsight.index.gallery.files import EMBEDDINGS_FILE, GALLERY_FILES, INDEX_FILE, gallery_writer
from nearsight.index.gallery.graph import GRAPH_FILES, GRAPH_VERSION, compute_graph, write_graph
from nearsight.index.gallery.lock import gallery_lock, sweep_temporaries
from nearsight.index.gallery.payload import write_payload_into
from nearsight.index.vector_store import describe_source, keep_embeddings

UNIT_NORM_TOLERANCE = 1e-3
CHECK_BLOCK_ROWS = 1 << 16  # vectors checked at a time (finite, unit norm)


def check_vectors(vectors: np.ndarray, count: int, dim: int | None = None) -> np.ndarray:
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
    array = check_vectors(vectors, len(items))
    budget = parse_memory(max_index_memory)
    resolved = resolve_index_type(index_type, len(array), array.shape[1], budget)
    count, dim = array.shape
    keep = keep_embeddings(embeddings, count, dim, resolved, budget, vector_source is not None)
    source = None
    if not keep and vector_source is not None and resolved in PQ_TYPES:
        source = describe_source(vector_source)
    ids = np.arange(len(array), dtype=np.int64)
    final = Path(out_dir).expanduser().absolute()
    with gallery_lock(final, exclusive=True), write_errors(final):
        sweep_temporaries(final)
        with gallery_writer(final) as tmp:
            rerank = keep or source is not None  # PQ searches re-rank by exact vectors
            index, params = index_in_build_order(
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
            write_arrays(tmp, index, array if keep else None)
            if resolved == "hnsw" and rerank and target_recall is not None:
                write_partition_into(tmp, array, ids)
            if neighbour_graph:
                write_graph_into(tmp, index, full_meta, array, ids)
    return final


def common_folder(items: Sequence[dict[str, Any]]) -> str | None:
    """The deepest folder holding every item's file, when all paths are absolute and share
    one below the file system's root (else None)."""
    paths = [str(item.get("path") or "") for item in items]
    if not paths or not all(os.path.isabs(path) for path in paths):
        return None
    folder = os.path.commonpath([os.path.dirname(path) for path in paths])
    return folder if folder != os.path.dirname(folder) else None


def index_in_build_order(
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


def write_partition_into(folder: Path, vectors: np.ndarray, ids: np.ndarray) -> None:
    """An HNSW gallery's coarse partition for its filtered searches (index.ann.coarse), tuned
    on the same held-out queries as the index; none where no rule reaches the target."""
    partition = partition_for(vectors, ids, tuning_sample(len(ids), "hnsw"))
    if partition is not None:
        coarse.write_partition(folder, partition)


def write_arrays(folder: Path, index: faiss.Index, embeddings: np.ndarray | None) -> None:
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


def write_graph_into(
    folder: Path, index: faiss.Index, meta: dict[str, Any], vectors: np.ndarray, ids: np.ndarray
) -> None:
    """The neighbour graph of the base index's items into the temporary folder."""
    apply_search_parameters(index, meta)  # the tuned nprobe / efSearch
    # see IndexSearch._search_raw (index_search.py)
    search = getattr(index, "search_numpy", index.search)
    neighbours, sims = compute_graph(search, vectors, ids)
    write_graph(folder, neighbours, sims)
    for name in GRAPH_FILES:
        with open(folder / name, "rb") as handle:
            os.fsync(handle.fileno())


@contextlib.contextmanager
def write_errors(folder: Path) -> Iterator[None]:
    """A write that fails for a reason outside nearsight (a full disk, a quota, a read-only
    folder) becomes an OSError naming the gallery (SQLite's and numpy's own messages name
    neither the file nor the gallery). gallery_writer has removed its temporary folder by
    then: the previous gallery is untouched."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise OSError(f"cannot write gallery {folder}: {reason}") from None
