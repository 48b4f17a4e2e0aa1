"""Append segments of a gallery: what ``add`` writes instead of rewriting the whole gallery.

A segment is one file in the gallery folder, ``segment-<first id>.npz`` (numpy's uncompressed
zip: ``ids`` int64 [n] and ``vectors`` float32 [n, D]), holding the vectors of one ``add``. The
catalog is the commit point: a segment counts only once the catalog meta lists it
(``segments``), and the catalog rows, the list and ``count`` change in one SQLite transaction.
``add`` writes the segment (temporary name, fsync, rename), then commits that transaction; a
writer killed in between leaves a segment nobody lists, which the next writer deletes
(:func:`sweep_unlisted`). ``remove`` is a catalog transaction alone: the ids go to the meta list
``removed`` and are dropped from the in-memory index when the gallery is opened. ``nearsight
index compact`` folds segments and removals into a new base index and embeddings (a whole,
copy-on-write rewrite).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from nearsight.core.arrays import load_arrays
from nearsight.index.catalog.store import GalleryError

SEGMENT_PATTERN = re.compile(r"segment-\d{12}\.npz")
_TEMPORARY_PATTERN = re.compile(r"\.segment-\d{12}\.npz\.[0-9]+\.tmp")


def segment_name(first_id: int) -> str:
    return f"segment-{first_id:012d}.npz"


def write_segment(folder: Path, ids: np.ndarray, vectors: np.ndarray) -> str:
    """Write ids and vectors as a new segment file in ``folder`` (durably, under its final name
    only once whole); returns its name."""
    name = segment_name(int(ids[0]))
    final = folder / name
    temporary = folder / f".{name}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as handle:
            np.savez(handle, ids=np.asarray(ids, np.int64), vectors=np.asarray(vectors, np.float32))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return name


def read_segment(folder: Path, name: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of a listed segment; GalleryError when it is missing or damaged."""
    path = folder / name
    if not SEGMENT_PATTERN.fullmatch(name):
        raise GalleryError(f"gallery {folder} is damaged: its catalog lists segment {name!r}")
    try:
        ids, vectors = load_arrays(path, ("ids", "vectors"), allow_pickle=False)
    except FileNotFoundError:
        raise GalleryError(f"gallery {folder} is incomplete: it has no {name}") from None
    except (OSError, ValueError, KeyError, EOFError) as error:
        raise GalleryError(f"{path} is not a readable segment ({error})") from None
    if vectors.ndim != 2 or vectors.shape != (len(ids), dim) or vectors.dtype != np.float32:
        raise GalleryError(f"{path} should hold {len(ids)} float32 vectors of dim {dim}")
    return ids.astype(np.int64, copy=False), np.ascontiguousarray(vectors)


def sweep_unlisted(folder: Path, listed: list[str]) -> None:
    """Delete segment files the catalog does not list, and temporaries (under the write lock):
    what writers killed before their catalog transaction committed left behind."""
    keep = set(listed)
    for path in folder.iterdir():
        stray = SEGMENT_PATTERN.fullmatch(path.name) and path.name not in keep
        if stray or _TEMPORARY_PATTERN.fullmatch(path.name):
            path.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
