"""A gallery's leave-one-out analysis, in numpy over its stored embeddings: the items whose
top-1 is of another class (failures), the class pairs most often confused, Recall@k and the
distances of matching vs non-matching pairs.

Leave-one-out, as in the papers' protocol: a gallery item used as a query is removed from its own
results (by id, so an exact duplicate of it still counts as a neighbour).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nearsight.index.ann.faiss_index import unit_distance
from nearsight.search.evaluate import evaluate_gallery

MAX_PAIRS = 200_000  # pair distances sampled for the histogram (half matching, half not)
HISTOGRAM_BINS = 50
FAILURE_SEARCH_CHUNK = 4096  # queries per leave-one-out search call
# The analysis is two exact O(N^2) passes (the gallery's evaluate, then the failure list); see
# docs/decisions.md for its cost. Past this many labelled items the page skips it.
ANALYSIS_MAX_ITEMS = 100_000
UNKNOWN = -1  # the label of an unlabelled item or query

# (query vectors, k) -> (distances, ids), each [queries, k]; ids < 0 where fewer were found
SearchFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


@dataclass
class Failure:
    """A labelled gallery item whose leave-one-out top-1 is of another class."""

    id: int
    label: int
    top1_id: int
    top1_label: int
    top1_distance: float
    # distance to the nearest other item of the query's class (None: the class has no other)
    positive_distance: float | None
    positive_id: int | None = None  # that item (None: the class has no other)

    @property
    def margin(self) -> float | None:
        """How much nearer the wrong top-1 is than the nearest right item (> 0 always)."""
        if self.positive_distance is None:
            return None
        return self.positive_distance - self.top1_distance


@dataclass
class Analysis:
    """A gallery's leave-one-out picture, computed once from the stored embeddings."""

    labelled: int
    metrics: dict[str, float | int] | None  # the gallery's evaluate() dict; None: < 2 labelled
    failures: list[Failure] = field(default_factory=list)  # worst (largest margin) first
    confused_pairs: list[tuple[int, int, int]] = field(default_factory=list)  # (a, b, count)
    # histogram of pair distances: bin edges and densities of matching / non-matching pairs
    bin_edges: np.ndarray | None = None
    matching_density: np.ndarray | None = None
    non_matching_density: np.ndarray | None = None
    matching_pairs: int = 0
    non_matching_pairs: int = 0
    pairs_sampled: bool = False  # False: every pair of the gallery is in the histogram
    error: str | None = None  # why the analysis could not be made


def analyse(gallery: Any, max_items: int = ANALYSIS_MAX_ITEMS) -> Analysis:
    """The leave-one-out analysis of an open :class:`~nearsight.index.gallery.Gallery` (its
    ``ids``, ``labels``, ``embeddings``, ``search`` and ``evaluate``). Galleries with fewer than
    2 or more than ``max_items`` labelled items get an Analysis whose ``error`` says why."""
    ids = np.asarray(gallery.ids, dtype=np.int64)
    labels = np.asarray(gallery.labels, dtype=np.int64)
    labelled_mask = labels >= 0
    labelled = int(labelled_mask.sum())
    if labelled < 2:
        return Analysis(
            labelled=labelled,
            metrics=None,
            error=f"the gallery has {labelled} labelled items: leave-one-out needs at least 2",
        )
    if labelled > max_items:
        return Analysis(
            labelled=labelled,
            metrics=None,
            error=f"the gallery has {labelled} labelled items, more than the page analyses "
            f"({max_items}; `nearsight serve --analysis-max-items` raises it): "
            "`nearsight eval` computes Recall@k",
        )
    metrics = evaluate_gallery(gallery)
    embeddings = np.asarray(gallery.embeddings, dtype=np.float32)
    failures = leave_one_out_failures(gallery.search, embeddings, ids, labels)
    vectors = embeddings[labelled_mask]
    edges, matching, non_matching, counts = pair_distance_histogram(vectors, labels[labelled_mask])
    return Analysis(
        labelled=labelled,
        metrics=metrics,
        failures=failures,
        confused_pairs=confused_pairs(failures),
        bin_edges=edges,
        matching_density=matching,
        non_matching_density=non_matching,
        matching_pairs=counts[0],
        non_matching_pairs=counts[1],
        pairs_sampled=sum(counts) < labelled * (labelled - 1) // 2,
    )


def leave_one_out_failures(
    search: SearchFn, embeddings: np.ndarray, ids: np.ndarray, labels: np.ndarray
) -> list[Failure]:
    """Labelled items whose nearest other item (through ``search``, the gallery's own index, as
    the page's grid finds it) is labelled with another class; worst (largest margin) first.
    ``embeddings``, ``ids`` and ``labels`` are the gallery's rows in index order."""
    position = {int(item_id): row for row, item_id in enumerate(ids)}
    positions = np.flatnonzero(labels >= 0)
    top_ids = np.empty(len(positions), np.int64)
    top_distances = np.empty(len(positions), np.float32)
    for start in range(0, len(positions), FAILURE_SEARCH_CHUNK):
        chunk = positions[start : start + FAILURE_SEARCH_CHUNK]
        distances, found_ids = search(embeddings[chunk], 2)
        own = ids[chunk]
        # the query's own id is dropped wherever it is (an exact duplicate may come first)
        first_is_self = found_ids[:, 0] == own
        if found_ids.shape[1] < 2:  # a gallery of one item: no other item to find
            found_ids = np.concatenate([found_ids, np.full_like(found_ids, -1)], axis=1)
            distances = np.concatenate([distances, np.full_like(distances, np.inf)], axis=1)
        pick = first_is_self.astype(np.int64)
        top_ids[start : start + len(chunk)] = found_ids[np.arange(len(chunk)), pick]
        top_distances[start : start + len(chunk)] = distances[np.arange(len(chunk)), pick]

    found = top_ids >= 0
    top_positions = np.array([position.get(int(i), -1) for i in top_ids], dtype=np.int64)
    top_labels = np.where(found, labels[np.maximum(top_positions, 0)], UNKNOWN)
    own_labels = labels[positions]
    wrong = found & (top_labels >= 0) & (top_labels != own_labels)

    wrong_positions = positions[wrong]
    positive, positive_rows = nearest_same_class(embeddings, labels, wrong_positions)
    failures = [
        Failure(
            id=int(ids[p]),
            label=int(labels[p]),
            top1_id=int(t),
            top1_label=int(tl),
            top1_distance=float(d),
            positive_distance=None if not math.isfinite(pd) else float(pd),
            positive_id=None if pr < 0 else int(ids[pr]),
        )
        for p, t, tl, d, pd, pr in zip(
            wrong_positions,
            top_ids[wrong],
            top_labels[wrong],
            top_distances[wrong],
            positive,
            positive_rows,
            strict=True,
        )
    ]
    failures.sort(key=lambda f: (-(f.margin if f.margin is not None else math.inf), f.id))
    return failures


def nearest_same_class_distance(
    embeddings: np.ndarray, labels: np.ndarray, queries: np.ndarray
) -> np.ndarray:
    """For each query position, the distance to the nearest other item of its class (inf when
    it has none), one matrix product per class."""
    return nearest_same_class(embeddings, labels, queries)[0]


def nearest_same_class(
    embeddings: np.ndarray, labels: np.ndarray, queries: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each query position, the distance to the nearest other item of its class and that
    item's position (inf and -1 when it has none), one matrix product per class."""
    result = np.full(len(queries), np.inf, dtype=np.float32)
    nearest = np.full(len(queries), -1, dtype=np.int64)
    if not len(queries):
        return result, nearest
    query_labels = labels[queries]
    for label in np.unique(query_labels):
        rows = np.flatnonzero(query_labels == label)
        members = np.flatnonzero(labels == label)
        inner = embeddings[queries[rows]] @ embeddings[members].T  # [q, m]
        inner[queries[rows][:, None] == members[None, :]] = -np.inf  # not itself
        best_column = inner.argmax(axis=1)
        best = inner[np.arange(len(rows)), best_column]
        found = np.isfinite(best)
        result[rows] = np.where(found, unit_distance(np.maximum(best, -1.0)), np.inf)
        nearest[rows] = np.where(found, members[best_column], -1)
    return result, nearest


def confused_pairs(failures: Sequence[Failure], limit: int = 50) -> list[tuple[int, int, int]]:
    """(class a, class b, count) of unordered class pairs by how many top-1 failures mix them,
    most first."""
    counts: dict[tuple[int, int], int] = {}
    for failure in failures:
        pair = (min(failure.label, failure.top1_label), max(failure.label, failure.top1_label))
        counts[pair] = counts.get(pair, 0) + 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [(a, b, count) for (a, b), count in ordered[:limit]]


def pair_distance_histogram(
    vectors: np.ndarray,
    labels: np.ndarray,
    *,
    max_pairs: int = MAX_PAIRS,
    bins: int = HISTOGRAM_BINS,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """Distances of sampled matching (same class) and non-matching pairs, as densities over
    ``bins`` equal bins of the range they occupy in [0, 2] (RankMI, Figure 1). At most
    ``max_pairs`` pairs in all: half of each kind, or every pair when there are fewer. Returns (edges, matching density,
    non-matching density, (matching pairs, non-matching pairs))."""
    rng = np.random.default_rng(seed)
    n = len(vectors)
    per_kind = max_pairs // 2
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.searchsorted(sorted_labels, sorted_labels, side="left")
    sizes = np.searchsorted(sorted_labels, sorted_labels, side="right") - starts

    # matching: every pair if there are few, else a random item and a random other member
    _, class_sizes = np.unique(labels, return_counts=True)
    total_matching = int((class_sizes * (class_sizes - 1) // 2).sum())
    if total_matching <= per_kind:
        first, second = _all_same_class_pairs(sorted_labels)
    else:
        eligible = np.flatnonzero(sizes > 1)
        first = eligible[rng.integers(0, len(eligible), per_kind)]
        offset = rng.integers(0, sizes[first] - 1)  # a member other than itself
        second = starts[first] + offset
        second = second + (second >= first)  # skip the item itself
    matching = _pair_distances(vectors, order[first], order[second])

    # non-matching: random pairs, those of one class rejected
    total_pairs = n * (n - 1) // 2
    if total_pairs - total_matching <= per_kind:
        a, b = np.triu_indices(n, k=1)
        keep = labels[a] != labels[b]
        a, b = a[keep], b[keep]
    else:
        a = rng.integers(0, n, 2 * per_kind)
        b = rng.integers(0, n, 2 * per_kind)
        keep = labels[a] != labels[b]
        a, b = a[keep][:per_kind], b[keep][:per_kind]
    non_matching = _pair_distances(vectors, a, b)

    edges = _bin_edges(np.concatenate([matching, non_matching]), bins)
    return (
        edges,
        _density(matching, edges),
        _density(non_matching, edges),
        (len(matching), len(non_matching)),
    )


def _bin_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """Equal bins over the range the distances occupy (an untrained net packs them into a
    sliver of [0, 2]), padded by half a bin; [0, 2] when there is nothing to show."""
    if not len(values):
        return np.linspace(0.0, 2.0, bins + 1)
    low, high = float(values.min()), float(values.max())
    pad = max((high - low) / (2 * bins), 1e-3)
    return np.linspace(max(0.0, low - pad), min(2.0, high + pad), bins + 1)


def _all_same_class_pairs(sorted_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.triu_indices(len(sorted_labels), k=1)
    keep = sorted_labels[a] == sorted_labels[b]
    return a[keep], b[keep]


def _pair_distances(vectors: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not len(a):
        return np.zeros(0, np.float32)
    inner = np.einsum("ij,ij->i", vectors[a], vectors[b])
    return unit_distance(np.clip(inner, -1.0, 1.0))


def _density(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    counts, _ = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)
    width = edges[1] - edges[0]
    total = counts.sum()
    return counts / (total * width) if total else counts.astype(np.float64)
