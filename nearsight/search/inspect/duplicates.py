"""Duplicate images: pairs of items that are the same picture (equal bytes, or a resized or
recompressed copy), inside one gallery or across two (a training set leaking into a test set).

Two steps. Candidates come from the embedding: each item's nearest items closer than a
threshold chosen from the gallery's own distances (the :data:`PAIR_QUANTILE` quantile of the
distances of random pairs of its items: "closer than 99% of random pairs"). A retrieval
embedding puts distinct items of one class as close as copies, so every candidate is then
confirmed on the pixels: a perceptual hash (imagehash's DCT pHash, 64 bits) within
:data:`HASH_DISTANCE` bits. Items with equal bytes (their catalog sha256) are pairs whatever
their distance.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.images import load_image
from nearsight.search.inspect.items import (
    GalleryLike,
    Items,
    distance,
    exact_neighbours,
    gallery_items,
    opened,
)

if TYPE_CHECKING:
    import pandas as pd

CANDIDATES_PER_ITEM = 5  # nearest items each item offers as candidates
PAIR_QUANTILE = 0.01  # the candidate threshold: this quantile of random pairs' distances
THRESHOLD_PAIRS = 200_000  # random pairs the threshold is estimated from
HASH_DISTANCE = 8  # pHash bits (of 64) two copies may differ by
HASH_SIDE = 64  # images are decoded at least this large to be hashed


@dataclass
class Duplicates:
    """The confirmed pairs and what each step found."""

    pairs: pd.DataFrame = field(repr=False)  # the confirmed candidates
    candidate_pairs: pd.DataFrame = field(repr=False)  # every candidate, column "confirmed"
    threshold: float  # the embedding distance below which pairs were candidates
    candidates: int  # pairs the embedding proposed (and equal-bytes pairs)
    confirmed: int
    unreadable: int = 0  # candidates whose images could not be read (not confirmed)

    def summary(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "candidates": self.candidates,
            "confirmed": self.confirmed,
            "unreadable": self.unreadable,
        }


def find_duplicates(
    gallery: GalleryLike,
    against: GalleryLike | None = None,
    *,
    threshold: float | None = None,
    hash_distance: int = HASH_DISTANCE,
    per_item: int = CANDIDATES_PER_ITEM,
) -> Duplicates:
    """Same-picture pairs inside ``gallery``, or between ``gallery`` and ``against`` (the same
    model's gallery). ``threshold``: the candidates' embedding distance (default: chosen from
    the gallery's distances, module docstring)."""
    with opened(gallery) as first:
        items_a = gallery_items(first)
        vectors_a = np.asarray(first.embeddings, dtype=np.float32)
        if threshold is None:
            threshold = distance_threshold(vectors_a)
        if against is None:
            items_b, vectors_b = items_a, vectors_a
        else:
            with opened(against) as second:
                if second.dim != first.dim or second.model_sha256 != first.model_sha256:
                    raise NearsightError(
                        f"{second.path} was embedded by another model than {first.path}: "
                        "duplicates across galleries need the same model"
                    )
                items_b = gallery_items(second)
                vectors_b = np.asarray(second.embeddings, dtype=np.float32)
    same = against is None
    candidates = dict(_embedding_candidates(vectors_a, vectors_b, threshold, per_item, same))
    for pair in _equal_bytes(items_a, items_b, same):
        candidates.setdefault(pair, 0.0)
    hashes_a = _Hashes(items_a)
    hashes_b = hashes_a if same else _Hashes(items_b)
    checked: list[tuple[int, int, float, int, bool, bool]] = []
    unreadable = 0
    for (row_a, row_b), dist in sorted(candidates.items()):
        same_bytes = items_a.sha256[row_a] is not None and (
            items_a.sha256[row_a] == items_b.sha256[row_b]
        )
        hash_a, hash_b = hashes_a(row_a), hashes_b(row_b)
        if hash_a is None or hash_b is None:
            unreadable += not same_bytes
            bits = -1
        else:
            bits = int(hash_a - hash_b)
        confirmed = same_bytes or 0 <= bits <= hash_distance
        checked.append((row_a, row_b, dist, bits, same_bytes, confirmed))
    frame = _pairs_frame(items_a, items_b, checked)
    pairs = frame[frame["confirmed"]].drop(columns="confirmed").reset_index(drop=True)
    return Duplicates(
        pairs=pairs,
        candidate_pairs=frame,
        threshold=float(threshold),
        candidates=len(candidates),
        confirmed=len(pairs),
        unreadable=unreadable,
    )


def distance_threshold(
    vectors: np.ndarray,
    quantile: float = PAIR_QUANTILE,
    pairs: int = THRESHOLD_PAIRS,
    seed: int = 0,
) -> float:
    """The ``quantile`` of the distances of random pairs of distinct rows (seeded)."""
    if len(vectors) < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    a = rng.integers(0, len(vectors), pairs)
    b = rng.integers(0, len(vectors) - 1, pairs)
    b = b + (b >= a)  # never the row itself
    inner = np.einsum("ij,ij->i", vectors[a], vectors[b])
    return float(np.quantile(distance(inner), quantile))


def _embedding_candidates(
    vectors_a: np.ndarray, vectors_b: np.ndarray, threshold: float, per_item: int, same: bool
) -> Iterator[tuple[tuple[int, int], float]]:
    """((row in a, row in b), distance) of each item of b's nearest items in a within the
    threshold; inside one gallery each pair once, lower row first."""
    sims, found = exact_neighbours(vectors_b, vectors_a, per_item, leave_one_out=same)
    dists = distance(sims)
    for row_b, (rows_a, row_dists) in enumerate(zip(found, dists, strict=True)):
        for row_a, dist in zip(rows_a, row_dists, strict=True):
            if row_a < 0 or dist > threshold:
                continue
            pair = (min(row_a, row_b), max(row_a, row_b)) if same else (int(row_a), row_b)
            yield (int(pair[0]), int(pair[1])), float(dist)


def _equal_bytes(items_a: Items, items_b: Items, same: bool) -> Iterator[tuple[int, int]]:
    where: dict[str, list[int]] = {}
    for row, sha in enumerate(items_a.sha256):
        if sha:
            where.setdefault(sha, []).append(row)
    for row_b, sha in enumerate(items_b.sha256):
        for row_a in where.get(sha or "", []):
            if not same or row_a < row_b:
                yield row_a, row_b


class _Hashes:
    """Each item's perceptual hash, computed once; None when its image cannot be read."""

    def __init__(self, items: Items) -> None:
        self.items = items
        self._made: dict[int, Any] = {}

    def __call__(self, row: int) -> Any:
        import imagehash

        if row not in self._made:
            try:
                self._made[row] = imagehash.phash(load_image(self.items.paths[row], HASH_SIDE))
            except (NearsightError, OSError):
                self._made[row] = None
        return self._made[row]


def _pairs_frame(
    items_a: Items, items_b: Items, checked: list[tuple[int, int, float, int, bool, bool]]
) -> pd.DataFrame:
    import pandas as pd

    rows_a = np.array([c[0] for c in checked], dtype=np.int64)
    rows_b = np.array([c[1] for c in checked], dtype=np.int64)
    frame = pd.DataFrame(
        {
            **items_a.describe(rows_a, "a_"),
            **items_b.describe(rows_b, "b_"),
            "distance": [round(c[2], 6) for c in checked],
            "hash_bits": pd.array([None if c[3] < 0 else c[3] for c in checked], dtype="Int64"),
            "same_bytes": np.array([c[4] for c in checked], dtype=bool),
            "confirmed": np.array([c[5] for c in checked], dtype=bool),
        }
    )
    return frame.sort_values(["distance", "a_id", "b_id"], kind="stable", ignore_index=True)
