"""Changing an open gallery: appending segments, removing items, compacting, storing meta.

``add`` writes one segment file (nearsight/index/gallery/segments.py) and commits one catalog
transaction; ``remove`` commits one catalog transaction; ``compact`` is copy-on-write: it writes
a new folder holding the updated catalog, index and embeddings (nearsight/index/gallery/write.py
writes its files), then renames it. A crash (even SIGKILL) at any point leaves the previous
gallery whole; the next writer sweeps the hidden temporary folder or the unlisted segment it
left. Writers are serialised by an ``fcntl.flock`` on ``.GALLERY.lock`` beside the folder
(nearsight/index/gallery/lock.py), and a writer re-reads the gallery from disk once it holds the
lock, so two concurrent ``add`` calls both land.

:class:`nearsight.index.gallery.core.Gallery`'s ``add``, ``remove`` and ``compact`` are the
functions here.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import faiss
import numpy as np

from nearsight.core.atomic import recover_dir
from nearsight.index.ann import coarse
from nearsight.index.catalog.store import CATALOG_FILE, Catalog, GalleryError
from nearsight.index.gallery.files import check_consistent, gallery_writer
from nearsight.index.gallery.graph import GRAPH_VERSION
from nearsight.index.gallery.lock import gallery_lock, sweep_temporaries
from nearsight.index.gallery.payload import write_payload_into
from nearsight.index.gallery.segments import sweep_unlisted, write_segment
from nearsight.index.gallery.write import (
    check_vectors,
    index_in_build_order,
    write_arrays,
    write_errors,
    write_graph_into,
)

# add compacts once the segments hold more than this many items and this share of the base:
# appends stay O(added items) and a gallery of N items is rewritten after ~N/4 appended items
COMPACT_MIN_ITEMS = 100_000
COMPACT_SHARE = 0.25


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


def _write_segment(folder: Path, ids: np.ndarray, vectors: np.ndarray) -> str:
    return write_segment(folder, ids, vectors)  # one name to patch in fault tests


def add(gallery: Gallery, vectors: np.ndarray, items: Sequence[dict[str, Any]]) -> list[int]:
    """:meth:`Gallery.add <nearsight.index.gallery.core.Gallery.add>`: one segment file and one catalog
    transaction, then ``gallery`` is reloaded (or compacted, past the thresholds above)."""
    if not items:
        return []
    array = check_vectors(vectors, len(items), gallery.dim)
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

    def change(catalog: Catalog, current: Gallery) -> tuple[faiss.Index, np.ndarray | None]:
        if neighbour_graph is not None:
            catalog.set_meta(neighbour_graph=GRAPH_VERSION if neighbour_graph else None)
        # a gallery without embeddings.npy stays without (its vectors: the index, the source)
        embeddings = current.embeddings if current.embeddings_kept else None
        index = current._index  # segments added, removed ids dropped (not for HNSW)
        if current.index_type == "hnsw" and len(current._removed):
            # a fresh build's insertion order, so the same vectors give the same graph
            index, _ = index_in_build_order(current.embeddings, current.ids, "hnsw")
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
    with gallery_lock(folder, exclusive=True), write_errors(folder):
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


Change = Callable[[Catalog, "Gallery"], tuple[faiss.Index, np.ndarray | None]]


def _rewrite(gallery: Gallery, change: Change) -> None:
    """Copy-on-write under the write lock: read the gallery as it is on disk now, apply
    ``change`` to copies in a temporary folder, check them, rename the folder into place."""
    folder = gallery.path
    with gallery_lock(folder, exclusive=True):
        recover_dir(folder)
        sweep_temporaries(folder)
        current = _on_disk(gallery)
        try:
            with write_errors(folder), gallery_writer(folder) as tmp:
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
                write_arrays(tmp, index, embeddings)
                # the ids stay: the partition still holds (items added since are in no list)
                if (folder / coarse.PARTITION_FILE).is_file():
                    shutil.copy2(folder / coarse.PARTITION_FILE, tmp / coarse.PARTITION_FILE)
                if meta.get("neighbour_graph"):
                    vectors = current.vector_rows(ids) if embeddings is None else embeddings
                    write_graph_into(tmp, index, meta, np.asarray(vectors), ids)
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
