"""The files of a gallery folder: writing the folder whole, opening its catalog, and the check
that the files agree (nearsight/index/gallery/core.py reads them, nearsight/index/gallery/write.py and change.py write them).

Layout (DESIGN.md)::

    GALLERY/catalog.db      items (id = FAISS id, path, label, ...) and meta (nearsight.index.catalog)
    GALLERY/index.faiss     the CPU FAISS index; its ids are the catalog ids
    GALLERY/embeddings.npy  float32 [N, D], L2-normalised, row i = the i-th catalog id in order
                            (optional past the memory budget: meta ``embeddings_kept``,
                            nearsight/index/vector_store.py)
    GALLERY/payload.idx     the payload index: the filterable columns as sorted arrays, mapped
                            (nearsight/index/gallery/payload.py; rebuilt from the catalog when
                            missing)
    GALLERY/partition.npz   HNSW of 1,000 items or more: k-means lists of the items, read by the
                            exact way of filtered searches (nearsight/index/ann/coarse.py;
                            optional: a gallery without it searches as before)

A gallery folder is written whole into a temporary folder and renamed into place
(:func:`gallery_writer`); the catalog, the FAISS index and the embeddings are all written into
the same temporary folder before the rename.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from nearsight.core.arrays import load_array
from nearsight.core.atomic import atomic_dir, recover_dir
from nearsight.index.ann.faiss_index import METRIC, index_ids
from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.store import CATALOG_FILE, Catalog, GalleryError

INDEX_FILE = "index.faiss"
EMBEDDINGS_FILE = "embeddings.npy"
GALLERY_FILES = (CATALOG_FILE, INDEX_FILE, EMBEDDINGS_FILE)


@contextlib.contextmanager
def gallery_writer(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out_dir``; when the block succeeds it replaces
    ``out_dir``, when it fails it is deleted and the previous gallery is left untouched. A folder
    that exists and is not a gallery (no ``catalog.db``) is refused rather than replaced."""
    final = Path(out_dir).expanduser()
    recover_dir(final)
    if final.exists():
        if not final.is_dir():
            raise GalleryError(f"cannot write a gallery to {final}: it is a file")
        if any(final.iterdir()) and not (final / CATALOG_FILE).is_file():
            raise GalleryError(
                f"{final} already exists and is not a nearsight gallery (no {CATALOG_FILE}): "
                "choose a new folder or remove it"
            )
    with atomic_dir(final) as tmp:
        yield tmp


def write_catalog_dir(
    out_dir: str | os.PathLike[str], items: Iterable[dict[str, Any]], meta: dict[str, object]
) -> Path:
    """Write a gallery folder holding only ``catalog.db``; returns the folder."""
    with gallery_writer(out_dir) as tmp:
        create_catalog(tmp / CATALOG_FILE, items, meta)
    return Path(out_dir).expanduser()


def open_catalog_dir(gallery_dir: str | os.PathLike[str], *, readonly: bool = False) -> Catalog:
    """Open the catalog of a gallery folder (after undoing a crash in the middle of a replace)."""
    folder = Path(gallery_dir).expanduser()
    recover_dir(folder)
    if not (folder / CATALOG_FILE).is_file():
        raise GalleryError(f"not a nearsight gallery: {folder} has no {CATALOG_FILE}")
    return Catalog.open(folder / CATALOG_FILE, readonly=readonly)


def read_embeddings(path: Path) -> np.ndarray:
    try:
        array = load_array(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise GalleryError(f"{path} is not a readable embeddings file ({error})") from None
    if array.ndim != 2 or array.dtype != np.float32:
        raise GalleryError(
            f"{path} should hold float32 [N, D] embeddings, it holds {array.dtype} "
            f"{tuple(array.shape)}"
        )
    return array


def check_consistent(
    folder: Path,
    meta: dict,
    ids: np.ndarray,
    index: faiss.Index,
    embeddings: np.ndarray | None,
    segments: Sequence[tuple[np.ndarray, np.ndarray]],
    removed: np.ndarray,
) -> np.ndarray:
    """Check that the base index and embeddings (None: the gallery has none) agree, and that
    base + segments hold exactly the catalog's ids and the removed ones; returns the base
    ids, sorted."""
    missing = [key for key in ("model_sha256", "dim", "metric", "index_type") if key not in meta]
    if missing:
        raise GalleryError(f"gallery {folder} is damaged: its catalog meta has no '{missing[0]}'")
    if meta["metric"] != METRIC:
        raise GalleryError(f"gallery {folder} uses metric {meta['metric']!r}, not {METRIC!r}")
    dim = int(meta["dim"])
    rows, width = embeddings.shape if embeddings is not None else (index.ntotal, dim)
    if index.d != dim or width != dim:
        raise GalleryError(
            f"gallery {folder} is inconsistent: catalog dim {dim}, index dim {index.d}, "
            f"embeddings dim {width}"
        )
    added = sum(len(segment_ids) for segment_ids, _ in segments)
    count = len(ids)
    if index.ntotal + added != count + len(removed) or rows != index.ntotal:
        raise GalleryError(
            f"gallery {folder} is inconsistent: {count} catalog items, {index.ntotal} index "
            f"vectors, {rows} embeddings"
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
