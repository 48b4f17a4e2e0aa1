"""What the Gradio page shows, computed without Gradio: searches, thumbnails and each gallery's
leave-one-out analysis (failures, confused class pairs, Recall@k, pair-distance histogram).

A :class:`GalleryView` wraps one open :class:`index.gallery.Gallery` and the embedder that
matches it. Its analysis is computed once (the first caller computes it, the others wait) and
cached; the page starts it in a background thread so that the server answers at once.

Leave-one-out, as in the papers' protocol: a gallery item used as a query is removed from its own
results (by id, so an exact duplicate of it still counts as a neighbour). An uploaded image is
not a gallery item and nothing is removed from its results: an upload of a gallery file finds
that item at distance 0.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from PIL import Image

from nearsight.index.gallery import Gallery, unit_distance
from nearsight.index.images import load_image
from nearsight.models.errors import NearsightError

THUMBNAIL_SIDE = 160  # pixels, the longer side of a grid thumbnail
THUMBNAIL_CACHE_ITEMS = 4096  # per gallery; ~6 KB each as base64 JPEG
MAX_PAIRS = 200_000  # pair distances sampled for the histogram (half matching, half not)
HISTOGRAM_BINS = 50
FAILURE_SEARCH_CHUNK = 4096  # queries per leave-one-out search call
# The analysis is two exact O(N^2) passes (index.metrics.evaluate, then the failure list):
# ~1.5 min at 60k x 128 on 2 idle cores. Past this many labelled items the page skips it.
ANALYSIS_MAX_ITEMS = 100_000
UNKNOWN = -1  # the label of an unlabelled item or query


@dataclass
class Neighbour:
    rank: int
    id: int
    path: str
    label: int | None
    class_name: str | None
    distance: float | None  # None where an approximate index found fewer than k

    def as_json(self) -> dict[str, Any]:
        """The shape `nearsight search --json` prints (plus class_name)."""
        return {
            "id": self.id,
            "path": self.path,
            "label": self.label,
            "class_name": self.class_name,
            "distance": self.distance,
        }


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
    metrics: dict[str, float | int] | None  # index.metrics.evaluate's dict; None: < 2 labelled
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


class GalleryView:
    """One gallery as the page sees it: catalog rows in memory, the embedder, thumbnails and
    the cached analysis. Safe to use from several threads."""

    def __init__(
        self,
        name: str,
        gallery: Gallery,
        embedder: Any,
        analysis_max_items: int = ANALYSIS_MAX_ITEMS,
    ):
        self.name = name
        self.analysis_max_items = analysis_max_items
        self.gallery = gallery
        self.embedder = embedder
        self.rows: dict[int, dict[str, Any]] = {int(r["id"]): r for r in gallery.all_items()}
        self.ids = np.asarray(gallery.ids, dtype=np.int64)
        self.labels = np.asarray(gallery.labels, dtype=np.int64)
        self.position = {int(item_id): row for row, item_id in enumerate(self.ids)}
        self.class_names = class_names(self.rows.values())
        self.by_sha256: dict[str, int] = {}
        for item_id, row in self.rows.items():
            if row.get("sha256"):
                self.by_sha256.setdefault(str(row["sha256"]), item_id)
        self._thumbs: OrderedDict[int, str | None] = OrderedDict()
        self._thumbs_lock = threading.Lock()
        self._analysis: Analysis | None = None
        self._analysis_lock = threading.Lock()

    # -- facts -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def labelled_ids(self) -> np.ndarray:
        return self.ids[self.labels >= 0]

    def class_name(self, label: int | None) -> str:
        if label is None or label < 0:
            return "unknown"
        return self.class_names.get(int(label), f"class {label}")

    def label_of(self, item_id: int) -> int | None:
        row = self.row(item_id)
        return None if row["label"] is None else int(row["label"])

    def row(self, item_id: int) -> dict[str, Any]:
        try:
            return self.rows[int(item_id)]
        except KeyError:
            raise NearsightError(f"gallery {self.name} has no item with id {item_id}") from None

    def identical_item(self, data: bytes) -> int | None:
        """The id of a gallery item whose file has exactly these bytes, if any."""
        return self.by_sha256.get(hashlib.sha256(data).hexdigest())

    # -- searching ---------------------------------------------------------------------------

    def embed(self, image: Image.Image) -> np.ndarray:
        return np.asarray(self.embedder.embed_images([image]), dtype=np.float32)

    def search_vector(
        self, vector: np.ndarray, k: int, exclude_id: int | None = None
    ) -> list[Neighbour]:
        """The k nearest items of one query vector, nearest first; ``exclude_id``: leave that
        item out (a gallery item querying the others)."""
        depth = k + (1 if exclude_id is not None else 0)
        with _one_openmp_thread():
            distances, ids = self.gallery.search(
                np.asarray(vector, np.float32).reshape(1, -1), depth
            )
        found = [
            (int(i), float(d))
            for i, d in zip(ids[0], distances[0], strict=True)
            if i >= 0 and int(i) != exclude_id
        ][:k]
        result = []
        for rank, (item_id, distance) in enumerate(found, start=1):
            row = self.rows[item_id]
            result.append(
                Neighbour(
                    rank=rank,
                    id=item_id,
                    path=str(row["path"]),
                    label=None if row["label"] is None else int(row["label"]),
                    class_name=row["class_name"],
                    distance=distance if math.isfinite(distance) else None,
                )
            )
        return result

    def search_image(self, image: Image.Image, k: int) -> list[Neighbour]:
        return self.search_vector(self.embed(image), k)

    def search_item(self, item_id: int, k: int) -> list[Neighbour]:
        """Leave-one-out neighbours of a gallery item, from its stored embedding."""
        self.row(item_id)  # one-line error for an unknown id
        vector = np.asarray(self.gallery.embeddings[self.position[int(item_id)]], np.float32)
        return self.search_vector(vector, k, exclude_id=int(item_id))

    # -- thumbnails --------------------------------------------------------------------------

    def thumbnail(self, item_id: int) -> str | None:
        """A small JPEG data URI of a gallery item, or None when its file cannot be read."""
        item_id = int(item_id)
        with self._thumbs_lock:
            if item_id in self._thumbs:
                self._thumbs.move_to_end(item_id)
                return self._thumbs[item_id]
        try:
            uri: str | None = thumbnail_uri(load_image(self.rows[item_id]["path"]))
        except NearsightError:
            uri = None  # moved or unreadable since the gallery was built: a placeholder
        with self._thumbs_lock:
            self._thumbs[item_id] = uri
            while len(self._thumbs) > THUMBNAIL_CACHE_ITEMS:
                self._thumbs.popitem(last=False)
        return uri

    # -- analysis ----------------------------------------------------------------------------

    @property
    def analysis_ready(self) -> bool:
        return self._analysis is not None

    def analysis(self) -> Analysis:
        """The leave-one-out analysis, computed on first use (other callers wait for it)."""
        if self._analysis is None:
            with self._analysis_lock:
                if self._analysis is None:
                    self._analysis = analyse(self)
        return self._analysis

    def close(self) -> None:
        self.gallery.close()


@contextlib.contextmanager
def _one_openmp_thread():
    """Search one query on one OpenMP thread. OpenMP's thread count is a per-thread setting, so
    this affects the calling thread only, and it is restored after (torch's embedding uses
    OpenMP too). On a busy machine an OpenMP team spends far longer waiting for its members
    than one query takes (measured: 36 ms with 2 threads, 6 ms with 1, for 60k x 128 on 2
    loaded cores), and the page's requests run side by side anyway. The background analysis
    keeps every core for its batched searches."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def class_names(rows) -> dict[int, str]:
    """label -> class name (the first name seen for a label; 'class L' when none is stored)."""
    names: dict[int, str] = {}
    for row in rows:
        label = row.get("label")
        if label is None:
            continue
        name = row.get("class_name")
        if int(label) not in names or (name and names[int(label)].startswith("class ")):
            names[int(label)] = str(name) if name else f"class {label}"
    return dict(sorted(names.items()))


def thumbnail_uri(image: Image.Image, side: int = THUMBNAIL_SIDE) -> str:
    small = image.convert("RGB")
    small.thumbnail((side, side), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


# -- the leave-one-out analysis ----------------------------------------------------------------


def analyse(view: GalleryView) -> Analysis:
    labelled_mask = view.labels >= 0
    labelled = int(labelled_mask.sum())
    if labelled < 2:
        return Analysis(
            labelled=labelled,
            metrics=None,
            error=f"the gallery has {labelled} labelled items: leave-one-out needs at least 2",
        )
    if labelled > view.analysis_max_items:
        return Analysis(
            labelled=labelled,
            metrics=None,
            error=f"the gallery has {labelled} labelled items, more than the page analyses "
            f"({view.analysis_max_items}; `nearsight serve --analysis-max-items` raises it): "
            "`nearsight eval` computes Recall@k",
        )
    metrics = view.gallery.evaluate()
    embeddings = np.asarray(view.gallery.embeddings, dtype=np.float32)
    failures = leave_one_out_failures(view, embeddings, labelled_mask)
    vectors = embeddings[labelled_mask]
    labels = view.labels[labelled_mask]
    edges, matching, non_matching, counts = pair_distance_histogram(vectors, labels)
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
    view: GalleryView, embeddings: np.ndarray, labelled_mask: np.ndarray
) -> list[Failure]:
    """Labelled items whose nearest other item (through the gallery's own index, as the page's
    grid finds it) is labelled with another class; worst (largest margin) first."""
    positions = np.flatnonzero(labelled_mask)
    top_ids = np.empty(len(positions), np.int64)
    top_distances = np.empty(len(positions), np.float32)
    for start in range(0, len(positions), FAILURE_SEARCH_CHUNK):
        chunk = positions[start : start + FAILURE_SEARCH_CHUNK]
        distances, ids = view.gallery.search(embeddings[chunk], 2)
        own = view.ids[chunk]
        # the query's own id is dropped wherever it is (an exact duplicate may come first)
        first_is_self = ids[:, 0] == own
        if ids.shape[1] < 2:  # a gallery of one item: no other item to find
            ids = np.concatenate([ids, np.full_like(ids, -1)], axis=1)
            distances = np.concatenate([distances, np.full_like(distances, np.inf)], axis=1)
        pick = first_is_self.astype(np.int64)
        top_ids[start : start + len(chunk)] = ids[np.arange(len(chunk)), pick]
        top_distances[start : start + len(chunk)] = distances[np.arange(len(chunk)), pick]

    found = top_ids >= 0
    top_positions = np.array([view.position.get(int(i), -1) for i in top_ids], dtype=np.int64)
    top_labels = np.where(found, view.labels[np.maximum(top_positions, 0)], UNKNOWN)
    own_labels = view.labels[positions]
    wrong = found & (top_labels >= 0) & (top_labels != own_labels)

    wrong_positions = positions[wrong]
    positive = nearest_same_class_distance(embeddings, view.labels, wrong_positions)
    failures = [
        Failure(
            id=int(view.ids[p]),
            label=int(view.labels[p]),
            top1_id=int(t),
            top1_label=int(tl),
            top1_distance=float(d),
            positive_distance=None if not math.isfinite(pd) else float(pd),
        )
        for p, t, tl, d, pd in zip(
            wrong_positions,
            top_ids[wrong],
            top_labels[wrong],
            top_distances[wrong],
            positive,
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
    result = np.full(len(queries), np.inf, dtype=np.float32)
    if not len(queries):
        return result
    query_labels = labels[queries]
    for label in np.unique(query_labels):
        rows = np.flatnonzero(query_labels == label)
        members = np.flatnonzero(labels == label)
        inner = embeddings[queries[rows]] @ embeddings[members].T  # [q, m]
        inner[queries[rows][:, None] == members[None, :]] = -np.inf  # not itself
        best = inner.max(axis=1)
        result[rows] = np.where(np.isfinite(best), unit_distance(np.maximum(best, -1.0)), np.inf)
    return result


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
    ``bins`` equal bins of the range they occupy in [0, 2] (RankMI, Figure 1). At most ``max_pairs`` pairs in all: half
    of each kind, or every pair when there are fewer. Returns (edges, matching density,
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


# -- opening galleries with their model --------------------------------------------------------


def open_views(
    gallery_dirs: Sequence[str | os.PathLike[str]],
    model: str | os.PathLike[str] | None = None,
    device: str = "auto",
) -> list[GalleryView]:
    """Open every gallery with the model that embeds its uploads: ``model`` (which must match
    all of them) or the model path each gallery's meta records. One embedder per model file.
    Raises NearsightError (one line) for a missing/damaged gallery or a model that does not
    match."""
    from nearsight.models.embedder import load_embedder

    embedders: dict[Path, Any] = {}
    views: list[GalleryView] = []
    names = gallery_names(gallery_dirs)
    try:
        for name, folder in zip(names, gallery_dirs, strict=True):
            gallery = Gallery.open(folder)
            try:
                path = gallery.model_path(model)
                key = path.expanduser().resolve()
                if key not in embedders:
                    embedders[key] = load_embedder(path, device=device)
                gallery.check_model(embedders[key], path)
            except BaseException:
                gallery.close()
                raise
            views.append(GalleryView(name, gallery, embedders[key]))
    except BaseException:
        for view in views:
            view.close()
        raise
    return views


def gallery_names(gallery_dirs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Short unique names for the dropdown: the folder names, with a parent folder added (or a
    number) where two galleries share a name."""
    paths = [Path(folder).expanduser().absolute() for folder in gallery_dirs]
    plain = [path.name or str(path) for path in paths]
    names = [
        f"{path.parent.name}/{name}" if plain.count(name) > 1 and path.parent.name else name
        for path, name in zip(paths, plain, strict=True)
    ]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique
