"""Reading a gallery folder from disk, checked: what :meth:`Gallery.open` and ``reload`` hold
(nearsight/index/gallery/core.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from nearsight.index.ann.faiss_index import read_index
from nearsight.index.catalog.payload_index import PayloadIndex
from nearsight.index.catalog.store import CATALOG_FILE, Catalog, GalleryError
from nearsight.index.gallery.files import (
    EMBEDDINGS_FILE,
    INDEX_FILE,
    check_consistent,
    read_embeddings,
)
from nearsight.index.gallery.graph import read_graph
from nearsight.index.gallery.lock import gallery_lock, previous_path, recover
from nearsight.index.gallery.payload import open_payload
from nearsight.index.gallery.segments import read_segment

MMAP_MIN_BYTES = 1 << 30  # an index file this large is memory-mapped where FAISS can


@dataclass
class GalleryFiles:
    """A gallery folder as read: the open catalog (the caller closes it), its meta, the item
    ids and labels in catalog order, the base index and embeddings, the added segments, the
    removed ids and the optional neighbour graph."""

    catalog: Catalog
    meta: dict[str, Any]
    ids: np.ndarray
    labels: np.ndarray
    index: faiss.Index
    base_ids: np.ndarray
    embeddings: np.ndarray | None
    segments: list[tuple[np.ndarray, np.ndarray]]
    removed: np.ndarray
    graph: Any
    payload: PayloadIndex | None = None


def read_folder(folder: Path, *, locked: bool = False) -> GalleryFiles:
    """Read and check the folder; ``locked``: the caller holds the write lock already (a
    second flock from this process would wait for itself)."""
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
        if not (folder / INDEX_FILE).is_file():
            raise GalleryError(f"gallery {folder} is incomplete: it has no {INDEX_FILE}")
        catalog = Catalog.open(folder / CATALOG_FILE, readonly=True)
        try:
            ids, labels = catalog.labels()
            meta: dict[str, Any] = catalog.meta()
            kept = bool(meta.get("embeddings_kept", True))  # older galleries always kept it
            if kept and not (folder / EMBEDDINGS_FILE).is_file():
                raise GalleryError(f"gallery {folder} is incomplete: it has no {EMBEDDINGS_FILE}")
            pending = meta.get("segments") or meta.get("removed")
            mappable = (folder / INDEX_FILE).stat().st_size >= MMAP_MIN_BYTES
            index = read_index(folder / INDEX_FILE, mmap=mappable and not pending)
            embeddings = read_embeddings(folder / EMBEDDINGS_FILE) if kept else None
            dim = int(meta.get("dim", index.d))
            segments = [read_segment(folder, name, dim) for name in meta.get("segments", [])]
            removed = np.sort(np.asarray(meta.get("removed", []), dtype=np.int64))
            base_ids = check_consistent(folder, meta, ids, index, embeddings, segments, removed)
            graph = read_graph(folder, meta, base_ids)
            # a writer's private read is never filtered: no payload index for it
            payload = None if locked else open_payload(folder, catalog, ids, removed)
        except BaseException:
            catalog.close()
            raise
    return GalleryFiles(catalog, meta, ids, labels, index, base_ids, embeddings, segments,
                        removed, graph, payload)  # fmt: skip
