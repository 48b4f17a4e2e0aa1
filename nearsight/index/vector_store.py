"""The vectors of a gallery's items, with or without ``embeddings.npy``.

A gallery keeps ``embeddings.npy`` (float32 [N, D], a second copy of what the index holds)
unless its build dropped it (``write_gallery(embeddings=...)``, ``--embeddings auto|keep|drop``;
the catalog meta says ``embeddings_kept``). ``auto`` drops it when the vectors (N x D x 4
bytes) exceed the memory budget (``--max-index-memory``, index.index_choice) and exact vectors
can still be had without it: from the index (flat, IVF-Flat and HNSW store the vectors
themselves) or from the files the gallery was imported from (``vector_source`` in the meta:
a ``.npy`` file or a chunk folder, row i = id i, rows L2-normalised on reading).

Where an item's vector comes from, first match:

1. an append segment (exact);
2. ``embeddings.npy`` (exact);
3. the recorded ``vector_source``, for ids it covers (exact);
4. the index: ``reconstruct_batch`` (exact for flat, IVF-Flat, HNSW; the decoded PQ code,
   approximate, for ivfpq/opq, whose searches then skip the exact re-rank).

:meth:`VectorStore.rows` gathers many items (evaluation, compaction): in memory while they fit
the budget, else in an unlinked temporary file mapped into memory (exact, and memory-bounded:
the kernel pages it out), filled in blocks.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from nearsight.core.arrays import load_array
from nearsight.core.errors import NearsightError

EMBEDDINGS_CHOICES = ("auto", "keep", "drop")
EXACT_INDEX_TYPES = ("flat", "ivf", "hnsw")  # store the vectors themselves
BLOCK_ROWS = 1 << 16  # rows gathered at a time into a temporary file


class ApproximateVectorsWarning(UserWarning):
    """Vectors read back from a compressed (PQ) index: the decoded codes, not the originals."""


def keep_embeddings(
    choice: str, count: int, dim: int, index_type: str, budget: int, has_source: bool
) -> bool:
    """Whether a build writes embeddings.npy (module docstring)."""
    if choice not in EMBEDDINGS_CHOICES:
        raise NearsightError(
            f"--embeddings must be one of {', '.join(EMBEDDINGS_CHOICES)}, got {choice!r}"
        )
    if choice != "auto":
        return choice == "keep"
    fits = count * dim * 4 <= budget
    return fits or not (index_type in EXACT_INDEX_TYPES or has_source)


def describe_source(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The meta record of a vector source: its absolute path and (file, rows) in order."""
    folder = Path(path).expanduser().absolute()
    files = sorted(folder.glob("*.npy")) if folder.is_dir() else [folder]
    return {
        "path": str(folder),
        "files": [[file.name, int(load_array(file, mmap_mode="r").shape[0])] for file in files],
    }


class VectorStore:
    """Item vectors by id, from the places the module docstring lists."""

    def __init__(
        self,
        index: faiss.Index,
        index_type: str,
        base_ids: np.ndarray,
        base_rows: np.ndarray | None,
        segments: list[tuple[np.ndarray, np.ndarray]],
        source: dict[str, Any] | None,
        budget: int,
    ) -> None:
        self.index = index
        self.index_type = index_type
        self.base_ids = base_ids  # sorted
        self.base_rows = base_rows
        # the same rows without np.memmap's Python-level indexing (a search gathers a few)
        self._base_plain = None if base_rows is None else base_rows.view(np.ndarray)
        self.budget = budget
        self.dim = int(index.d)
        self.segment_ids = np.concatenate([ids for ids, _ in segments] or [np.zeros(0, np.int64)])
        order = np.argsort(self.segment_ids, kind="stable")
        self.segment_ids = self.segment_ids[order]
        self.segment_rows = np.concatenate(
            [rows for _, rows in segments] or [np.zeros((0, self.dim), np.float32)]
        )[order]
        self.source = _Source(source, self.dim) if source and base_rows is None else None
        self._lock = threading.Lock()
        self._reconstructable = False

    @property
    def exact(self) -> bool:
        """Whether every vector comes back as it was added (not a decoded PQ code)."""
        if self.base_rows is not None or self.index_type in EXACT_INDEX_TYPES:
            return True
        return self.source is not None and self.source.covers(self.base_ids)

    @property
    def can_rerank(self) -> bool:
        """Whether PQ candidates can be re-ranked by original vectors (the file or the source
        files; items compacted in later come back decoded, a few among the candidates)."""
        return self.base_rows is not None or (self.source is not None and self.source.available)

    def vectors_of(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), D]: the vectors of ``ids`` (all held by the gallery), in order."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._base_plain is not None and not len(self.segment_ids):  # all in the base file
            rows = self._base_plain[np.searchsorted(self.base_ids, ids)]
            return rows.astype(np.float32, copy=False)
        out = np.empty((len(ids), self.dim), np.float32)
        position = np.searchsorted(self.segment_ids, ids)
        in_segment = position < len(self.segment_ids)
        in_segment[in_segment] = self.segment_ids[position[in_segment]] == ids[in_segment]
        out[in_segment] = self.segment_rows[position[in_segment]]
        rest = ~in_segment
        if not rest.any():
            return out
        wanted = ids[rest]
        if self.base_rows is not None:
            out[rest] = self.base_rows[np.searchsorted(self.base_ids, wanted)]
            return out
        from_source = self.source.holds(wanted) if self.source else np.zeros(len(wanted), bool)
        rows = np.empty((len(wanted), self.dim), np.float32)
        if from_source.any():
            assert self.source is not None, "only a source holds rows"
            rows[from_source] = self.source.rows(wanted[from_source])
        if not from_source.all():
            rows[~from_source] = self._reconstruct(wanted[~from_source])
        out[rest] = rows
        return out

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), D] of ``ids``: in memory within the budget, else a memory map of
        an unlinked temporary file, filled BLOCK_ROWS at a time."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) * self.dim * 4 <= self.budget:
            return self.vectors_of(ids)
        handle, name = tempfile.mkstemp(prefix="nearsight-vectors-", suffix=".npy")
        os.close(handle)
        try:
            out = np.lib.format.open_memmap(name, "w+", np.float32, (len(ids), self.dim))
        finally:
            os.unlink(name)  # the map keeps the data; nothing is left behind on exit or kill
        for start in range(0, len(ids), BLOCK_ROWS):
            out[start : start + BLOCK_ROWS] = self.vectors_of(ids[start : start + BLOCK_ROWS])
        return out

    def _reconstruct(self, ids: np.ndarray) -> np.ndarray:
        with self._lock:
            if not self._reconstructable and self.index_type not in ("flat", "hnsw"):
                # IVF lists find an id through a hash table of (list, offset) built once
                hashtable = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]  # not in stubs
                faiss.extract_index_ivf(self.index).set_direct_map_type(hashtable)
            self._reconstructable = True
            vectors = self.index.reconstruct_batch(np.ascontiguousarray(ids, dtype=np.int64))
        return np.asarray(vectors, dtype=np.float32)


class _Source:
    """The .npy files a gallery was imported from: row i of their concatenation is id i."""

    def __init__(self, record: dict[str, Any], dim: int) -> None:
        folder = Path(record["path"])
        self.paths = [folder / name if folder.is_dir() else folder for name, _ in record["files"]]
        self.sizes = [int(rows) for _, rows in record["files"]]
        self.starts = np.cumsum([0, *self.sizes])
        self.dim = dim
        self._arrays: list[np.ndarray] | None = None
        self.available = self._open()

    def _open(self) -> bool:
        """Map the files; False (use the index instead) when one is gone or changed shape."""
        arrays = []
        for path, size in zip(self.paths, self.sizes, strict=True):
            if size == 0:  # an empty chunk (no readable image) holds no rows to map
                arrays.append(np.zeros((0, self.dim), np.float32))
                continue
            try:
                array = load_array(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError, EOFError):
                return False
            if array.shape != (size, self.dim):
                return False
            arrays.append(array)
        self._arrays = arrays
        return True

    def covers(self, ids: np.ndarray) -> bool:
        return self.available and (len(ids) == 0 or int(ids.max()) < int(self.starts[-1]))

    def holds(self, ids: np.ndarray) -> np.ndarray:
        if not self.available:
            return np.zeros(len(ids), bool)
        return (ids >= 0) & (ids < int(self.starts[-1]))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        assert self._arrays is not None
        out = np.empty((len(ids), self.dim), np.float32)
        file_of = np.searchsorted(self.starts, ids, side="right") - 1
        for number in np.unique(file_of):
            mask = file_of == number
            out[mask] = self._arrays[number][ids[mask] - self.starts[number]]
        # as nearsight.index.chunks.read_vectors made them for the index: unit rows
        return out / np.linalg.norm(out, axis=1, keepdims=True)
