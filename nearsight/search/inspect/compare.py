"""Two galleries of the same items (two models, or a model before and after training) compared
query by query: which leave-one-out queries the second one fixed, which it broke, which both
get wrong; Recall@1 of each and a paired bootstrap interval on the difference.

Items are matched by key when both galleries have a key column, else by path (within the
dataset folder each was built from, when both record one: the same dataset copied to another
place still matches). Each gallery is
searched over the matched labelled items only (exactly, leave-one-out), so both answer the same
queries over the same candidates; each judges correctness by its own labels. Then, exactly,
``fixed - broken == (recall@1 of the gallery - recall@1 of the baseline) * queries``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
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

    from nearsight.index.gallery.core import Gallery

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95
VERDICTS = ("fixed", "broken", "wrong in both", "right in both")


@dataclass
class Comparison:
    """``gallery`` compared with ``baseline`` on the same queries."""

    matched_by: str  # "key" or "path"
    queries: int
    recall_gallery: float
    recall_baseline: float
    delta: float  # recall_gallery - recall_baseline
    interval: tuple[float, float]  # paired bootstrap interval on delta
    counts: dict[str, int]  # VERDICTS -> queries
    items: pd.DataFrame = field(repr=False)  # one row per query
    unmatched: tuple[int, int] = (0, 0)  # labelled items of (gallery, baseline) left out

    def summary(self) -> dict[str, Any]:
        """The numbers as plain JSON values."""
        return {
            "matched_by": self.matched_by,
            "queries": self.queries,
            "recall@1": self.recall_gallery,
            "baseline recall@1": self.recall_baseline,
            "delta recall@1": self.delta,
            "interval": list(self.interval),
            "confidence": CONFIDENCE,
            **self.counts,
            "unmatched": {"gallery": self.unmatched[0], "baseline": self.unmatched[1]},
        }


def compare_galleries(
    gallery: GalleryLike,
    baseline: GalleryLike,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare ``gallery`` with ``baseline`` (folders or open galleries) on their common
    labelled items (module docstring)."""
    with opened(gallery) as first, opened(baseline) as second:
        items_a, items_b = gallery_items(first), gallery_items(second)
        by = "key" if items_a.key_column and items_b.key_column else "path"
        rows_a, rows_b = match_rows(items_a, items_b, by)
        if len(rows_a) < 2:
            raise NearsightError(
                f"the galleries share {len(rows_a)} labelled items (matched by {by}): a "
                "comparison needs at least 2; build both from the same images"
            )
        top_a, sim_a = _top1(first, items_a, rows_a)
        top_b, sim_b = _top1(second, items_b, rows_b)
    right_a = items_a.labels[rows_a[top_a]] == items_a.labels[rows_a]
    right_b = items_b.labels[rows_b[top_b]] == items_b.labels[rows_b]
    verdict = np.where(
        right_a & ~right_b,
        "fixed",
        np.where(~right_a & right_b, "broken", np.where(right_a, "right in both", "wrong in both")),
    )
    counts = {name: int((verdict == name).sum()) for name in VERDICTS}
    recall_a, recall_b = float(right_a.mean()), float(right_b.mean())
    frame = _items_frame(items_a, items_b, rows_a, rows_b, top_a, top_b, sim_a, sim_b, verdict)
    labelled_a, labelled_b = int((items_a.labels >= 0).sum()), int((items_b.labels >= 0).sum())
    return Comparison(
        matched_by=by,
        queries=len(rows_a),
        recall_gallery=recall_a,
        recall_baseline=recall_b,
        delta=recall_a - recall_b,
        interval=paired_bootstrap(right_a, right_b, samples, seed),
        counts=counts,
        items=frame,
        unmatched=(labelled_a - len(rows_a), labelled_b - len(rows_b)),
    )


def match_rows(items_a: Items, items_b: Items, by: str) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in each gallery) of the labelled items both hold, in ``items_a``'s order."""
    if by == "key":
        names_a, names_b = items_a.identity(), items_b.identity()
    else:  # by path: within each dataset folder when both record one
        both = items_a.root is not None and items_b.root is not None
        names_a = [items_a.relative_path(p) if both else p for p in items_a.paths]
        names_b = [items_b.relative_path(p) if both else p for p in items_b.paths]
    where_b = {name: row for row, name in enumerate(names_b) if items_b.labels[row] >= 0}
    pairs = [
        (row, where_b[name])
        for row, name in enumerate(names_a)
        if items_a.labels[row] >= 0 and name in where_b
    ]
    rows = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return rows[:, 0], rows[:, 1]


def _top1(gallery: Gallery, items: Items, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each matched item's leave-one-out top-1 among the matched items: (index into rows,
    similarity)."""
    vectors = np.asarray(gallery.vector_rows(items.ids[rows]), dtype=np.float32)
    sims, found = exact_neighbours(vectors, vectors, 1, leave_one_out=True)
    return found[:, 0], sims[:, 0]


def paired_bootstrap(
    right_a: np.ndarray, right_b: np.ndarray, samples: int, seed: int
) -> tuple[float, float]:
    """The percentile interval (:data:`CONFIDENCE`) of mean(right_a) - mean(right_b) over
    ``samples`` resamplings of the queries, the same queries for both (paired)."""
    difference = right_a.astype(np.float64) - right_b.astype(np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(samples)
    for start in range(0, samples, 256):  # bounded memory: 256 resamples at a time
        count = min(256, samples - start)
        picks = rng.integers(0, len(difference), size=(count, len(difference)))
        means[start : start + count] = difference[picks].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def _items_frame(
    items_a: Items,
    items_b: Items,
    rows_a: np.ndarray,
    rows_b: np.ndarray,
    top_a: np.ndarray,
    top_b: np.ndarray,
    sim_a: np.ndarray,
    sim_b: np.ndarray,
    verdict: np.ndarray,
) -> pd.DataFrame:
    import pandas as pd

    described = items_a.describe(rows_a)
    return pd.DataFrame(
        {
            **described,
            "class": [items_a.class_name(int(items_a.labels[r])) for r in rows_a],
            "verdict": verdict,
            **items_a.describe(rows_a[top_a], "top1_"),
            "top1_class": [items_a.class_name(int(items_a.labels[r])) for r in rows_a[top_a]],
            "top1_distance": np.round(distance(sim_a), 6),
            **items_b.describe(rows_b, "baseline_"),  # the same item in the baseline
            **items_b.describe(rows_b[top_b], "baseline_top1_"),
            "baseline_top1_class": [
                items_b.class_name(int(items_b.labels[r])) for r in rows_b[top_b]
            ],
            "baseline_top1_distance": np.round(distance(sim_b), 6),
        }
    )
