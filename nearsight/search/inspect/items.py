"""What every inspection shows of a gallery's items: ids, keys, paths and classes, in the
gallery's row order (row i is ``gallery.ids[i]`` and ``gallery.embeddings[i]``), and the exact
leave-one-out neighbours of a set of vectors (faiss)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import faiss
import numpy as np

from nearsight.index.ann.faiss_index import unit_distance
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.keys import key_column

if TYPE_CHECKING:
    import pandas as pd

GalleryLike = Gallery | str | os.PathLike[str]


@contextlib.contextmanager
def opened(gallery: GalleryLike) -> Iterator[Gallery]:
    """``gallery`` itself when it is open, else the folder opened (and closed afterwards)."""
    if isinstance(gallery, Gallery):
        yield gallery
        return
    with Gallery.open(gallery) as opened_gallery:
        yield opened_gallery


@dataclass
class Items:
    """A gallery's items, one entry per row of its embeddings."""

    ids: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N], -1 where unlabelled
    paths: list[str]
    keys: list[str | None]  # the key column's values (None: the gallery has no key column)
    class_names: dict[int, str]
    sha256: list[str | None]
    key_column: str | None

    def __len__(self) -> int:
        return len(self.ids)

    def class_name(self, label: int | None) -> str | None:
        """The name of a class (its number as text when it has none); None: unlabelled."""
        if label is None or label < 0:
            return None
        return self.class_names.get(int(label), str(int(label)))

    root: str | None = None  # the dataset folder the gallery was built from, if recorded

    def identity(self) -> list[str]:
        """How an item is matched to the same item in another gallery: its key, else its
        path within the dataset folder the gallery was built from (the same dataset copied
        elsewhere still matches), else its path."""
        if self.key_column is not None:
            return [str(key) for key in self.keys]
        return [self.relative_path(path) for path in self.paths]

    def relative_path(self, path: str) -> str:
        """``path`` within the dataset folder (itself when outside it or none is recorded)."""
        if self.root is None:
            return path
        relative = os.path.relpath(path, self.root)
        return path if relative.startswith("..") else relative

    def describe(self, rows: np.ndarray, prefix: str = "") -> dict[str, list]:
        """Columns ``{prefix}id``, ``{prefix}key``, ``{prefix}path`` of ``rows`` (positions;
        -1: none)."""
        rows = np.asarray(rows, dtype=np.int64)
        found = rows >= 0
        return {
            f"{prefix}id": [
                int(self.ids[r]) if ok else None for r, ok in zip(rows, found, strict=True)
            ],
            f"{prefix}key": [
                self.keys[r] if ok else None for r, ok in zip(rows, found, strict=True)
            ],
            f"{prefix}path": [
                self.paths[r] if ok else None for r, ok in zip(rows, found, strict=True)
            ],
        }

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            {
                "id": self.ids,
                "key": self.keys,
                "path": self.paths,
                "label": self.labels,
                "class": [self.class_name(label) for label in self.labels],
            }
        )


def gallery_items(gallery: Gallery) -> Items:
    """The items of an open gallery, in its row order."""
    rows = {row["id"]: row for row in gallery.all_items()}
    ordered = [rows[int(item_id)] for item_id in gallery.ids]
    column = key_column(gallery)
    root = gallery.meta.get("root")
    if root and os.path.isfile(str(root)):  # a CSV's rows are relative to its folder
        root = os.path.dirname(str(root))
    keys = [None if column is None else (row.get("meta") or {}).get(column) for row in ordered]
    return Items(
        ids=np.asarray(gallery.ids, dtype=np.int64),
        labels=np.asarray(gallery.labels, dtype=np.int64),
        paths=[str(row["path"]) for row in ordered],
        keys=[None if key is None else str(key) for key in keys],
        class_names=gallery.class_names(),
        sha256=[row.get("sha256") for row in ordered],
        key_column=column,
        root=str(root) if root else None,
    )


def exact_neighbours(
    queries: np.ndarray, base: np.ndarray, k: int, *, leave_one_out: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest rows of ``base`` for each query, exactly (faiss flat inner product
    over unit vectors): (similarities [Q, k] float32, positions [Q, k] int64, -1 where base
    has fewer). ``leave_one_out``: the queries are ``base`` itself, and each row leaves out
    its own position (wherever it ranks: an exact copy may tie with it)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    base = np.ascontiguousarray(base, dtype=np.float32)
    depth = min(k + int(leave_one_out), len(base))
    index = faiss.IndexFlatIP(base.shape[1])
    index.add(base)
    sims, found = (
        index.search(queries, depth)
        if depth
        else (
            np.zeros((len(queries), 0), np.float32),
            np.zeros((len(queries), 0), np.int64),
        )
    )
    if leave_one_out:
        own = np.arange(len(queries))[:, None]
        is_self = found == own
        # drop the query's own column; where it was not found (ties), drop the last
        drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), depth - 1)
        keep = np.ones_like(found, dtype=bool)
        keep[np.arange(len(queries)), drop] = False
        sims = sims[keep].reshape(len(queries), depth - 1)
        found = found[keep].reshape(len(queries), depth - 1)
    if found.shape[1] < k:  # fewer rows than k: pad as faiss does
        pad = k - found.shape[1]
        sims = np.pad(sims, ((0, 0), (0, pad)), constant_values=-np.inf)
        found = np.pad(found, ((0, 0), (0, pad)), constant_values=-1)
    return sims.astype(np.float32), found.astype(np.int64)


def distance(similarity: np.ndarray | float) -> np.ndarray:
    """The gallery's distance (Euclidean between unit vectors) of an inner product."""
    return unit_distance(np.clip(np.asarray(similarity, dtype=np.float32), -1.0, 1.0))
