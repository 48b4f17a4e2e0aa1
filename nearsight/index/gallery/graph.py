"""The gallery's neighbour graph: each base item's nearest other items, stored beside the index.

Database-side augmentation needs every candidate's own top-k gallery neighbours. Searching
the index for them per query costs one search per candidate (tens of milliseconds at 10k items,
hundreds at 100k); the graph turns that into a lookup. It is optional (``index build
--neighbour-graph``, ``index compact --neighbour-graph``), written with the base index and
rebuilt by every compaction, and read as the gallery is now:

- removed items are masked out of the rows;
- items added since (segments) are merged in exactly, by their vectors;
- where that leaves a row short, or for an item added since, the caller searches the index.

Files: ``neighbours.npy`` (int64 [N, GRAPH_DEPTH], the ids nearest first, -1 for none) and
``neighbour_sims.npy`` (float32, their cosines); row i belongs to the i-th smallest base id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nearsight.core.arrays import load_array
from nearsight.index.catalog.store import GalleryError

GRAPH_FILE = "neighbours.npy"
GRAPH_SIMS_FILE = "neighbour_sims.npy"
GRAPH_FILES = (GRAPH_FILE, GRAPH_SIMS_FILE)
GRAPH_DEPTH = 16  # DBA's k up to 15, with one spare for a query left out
GRAPH_VERSION = 1
_CHUNK = 4096  # items searched per index call while building

# (vectors [n, D], depth) -> (distances, ids) [n, depth]: the gallery index's search
SearchFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def compute_graph(
    search: SearchFn, vectors: np.ndarray, ids: np.ndarray, depth: int = GRAPH_DEPTH
) -> tuple[np.ndarray, np.ndarray]:
    """(neighbour ids, cosines) [len(ids), depth] of every item ``ids[i]`` (sorted ids, vector
    ``vectors[i]``) through the index's ``search``, the item itself left out; the cosines
    are recomputed from the vectors, so a compressed index only chooses the set."""
    neighbours = np.full((len(ids), depth), -1, dtype=np.int64)
    sims = np.full((len(ids), depth), -np.inf, dtype=np.float32)
    for start in range(0, len(ids), _CHUNK):
        rows = slice(start, start + _CHUNK)
        _, found = search(np.ascontiguousarray(vectors[rows]), depth + 1)
        found = np.where(found == ids[rows, None], -1, found)  # the item itself
        keep = np.argsort(found < 0, axis=1, kind="stable")[:, :depth]
        found = np.take_along_axis(found, keep, axis=1)
        where = np.clip(np.searchsorted(ids, found), 0, len(ids) - 1)
        valid = (found >= 0) & (ids[where] == found)
        cos = np.einsum("nd,nkd->nk", vectors[rows], vectors[np.where(valid, where, 0)])
        order = np.argsort(np.where(valid, -cos, np.inf), axis=1, kind="stable")
        neighbours[rows, : found.shape[1]] = np.take_along_axis(
            np.where(valid, found, -1), order, 1
        )
        sims[rows, : found.shape[1]] = np.take_along_axis(np.where(valid, cos, -np.inf), order, 1)
    return neighbours, sims


def write_graph(folder: Path, neighbours: np.ndarray, sims: np.ndarray) -> None:
    """Write the graph files into a gallery's temporary folder (renamed with it)."""
    np.save(folder / GRAPH_FILE, np.ascontiguousarray(neighbours, dtype=np.int64))
    np.save(folder / GRAPH_SIMS_FILE, np.ascontiguousarray(sims, dtype=np.float32))


def read_graph(
    folder: Path, meta: dict[str, Any], base_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The stored graph (memory-mapped) or None when the gallery has none."""
    version = meta.get("neighbour_graph")
    if not version:
        return None
    if int(version) != GRAPH_VERSION:
        raise GalleryError(
            f"gallery {folder} has a version {version} neighbour graph; this nearsight reads "
            f"version {GRAPH_VERSION}: run `nearsight index compact --gallery {folder} "
            "--neighbour-graph`"
        )
    try:
        neighbours = load_array(folder / GRAPH_FILE, mmap_mode="r", allow_pickle=False)
        sims = load_array(folder / GRAPH_SIMS_FILE, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise GalleryError(f"gallery {folder} has a damaged neighbour graph: {error}") from None
    if neighbours.shape != sims.shape or neighbours.shape[0] != len(base_ids):
        raise GalleryError(
            f"gallery {folder} is inconsistent: a neighbour graph of {neighbours.shape[0]} rows "
            f"for {len(base_ids)} indexed items"
        )
    return neighbours, sims


def graph_neighbours(
    graph: tuple[np.ndarray, np.ndarray],
    base_ids: np.ndarray,
    removed: np.ndarray,
    added: tuple[np.ndarray, np.ndarray] | None,
    keys: np.ndarray,
    key_vectors: np.ndarray,
    depth: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sims, ids) [len(keys), depth] from the graph, and a mask of the rows it answered
    (a base item whose row keeps ``depth`` live neighbours, or every live one there is)."""
    neighbours, sims = graph
    rows = np.clip(np.searchsorted(base_ids, keys), 0, len(base_ids) - 1)
    ids = np.asarray(neighbours[rows]).copy()
    cos = np.asarray(sims[rows], dtype=np.float64).copy()
    dead = (ids < 0) | np.isin(ids, removed)
    ids[dead], cos[dead] = -1, -np.inf
    live = np.argsort(dead, axis=1, kind="stable")[:, :depth]  # live ones first, in order
    ids, cos = np.take_along_axis(ids, live, 1), np.take_along_axis(cos, live, 1)
    # enough live neighbours, or the row already held every other item there was
    complete = ((~dead).sum(axis=1) >= depth) | (np.asarray(neighbours[rows, -1]) < 0)
    answered = (base_ids[rows] == keys) & complete
    if added is not None and len(added[0]):
        added_ids, added_vectors = added
        extra = key_vectors.astype(np.float64) @ added_vectors.T.astype(np.float64)
        extra[added_ids[None, :] == keys[:, None]] = -np.inf
        both_ids = np.concatenate([ids, np.broadcast_to(added_ids, extra.shape)], axis=1)
        both = np.concatenate([cos, extra], axis=1)
        top = np.argsort(-both, axis=1, kind="stable")[:, :depth]
        ids, cos = np.take_along_axis(both_ids, top, 1), np.take_along_axis(both, top, 1)
        ids[~np.isfinite(cos)] = -1
    return cos, ids, answered
