"""NMI, as the deep-metric-learning papers compute it: k-means on the embeddings (faiss;
k = number of classes; k-means++ seeding, as in the MATLAB and scikit-learn k-means of the
original evaluation code; fixed seed), then the normalised mutual information between the
cluster assignment and the labels, from the contingency table in numpy (the arithmetic or the
geometric mean of the two entropies: nearsight/data/metrics/retrieval.py's docstring says which papers
use which). No scikit-learn: this is on the serving path (``nearsight eval``).
"""

from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.metrics.inputs import prepare_embeddings

# how NMI normalises the mutual information: by the mean of the two entropies, or their
# geometric mean (scikit-learn's average_method names)
NMI_AVERAGES = ("arithmetic", "geometric")
KMEANS_INITS = {
    "k-means++": "ClusteringInitMethod_KMEANS_PLUS_PLUS",
    "afk-mc2": "ClusteringInitMethod_AFK_MC2",
    "random": "ClusteringInitMethod_RANDOM",
}


def nmi(
    embeddings: np.ndarray,
    labels: Sequence | np.ndarray,
    *,
    seed: int = 0,
    niter: int = 20,
    init: str = "k-means++",
    average: str = "arithmetic",
) -> float:
    """NMI between the labels and a k-means clustering (k = number of classes) of the
    embeddings. ``init``: "k-means++" (default; MATLAB's and scikit-learn's default, which the
    original DML evaluation code used), "afk-mc2" (faiss's fast approximation of k-means++, for
    galleries with thousands of classes) or "random" (faiss's default: often merges clusters).
    ``average``: how the two entropies normalise the mutual information (NMI_AVERAGES)."""
    vectors, codes = prepare_embeddings(embeddings, labels)
    _check_average(average)
    if init not in KMEANS_INITS:
        raise NearsightError(f"k-means init must be one of {', '.join(KMEANS_INITS)}, got {init!r}")
    num_classes = int(codes.max()) + 1
    if num_classes == 1:
        return 1.0  # one class, one cluster: the assignment is the labelling
    options = {
        "niter": niter,
        "seed": seed,
        "verbose": False,
        # small galleries have few points per class: no "please provide more points" warning
        "min_points_per_centroid": 1,
    }
    init_centroids = None
    init_method = getattr(faiss, KMEANS_INITS[init], None)
    if init_method is not None:
        options["init_method"] = init_method
    elif init != "random":  # faiss before init_method existed (< 1.13): seed in numpy
        init_centroids = _kmeans_plusplus(vectors, num_classes, seed)
    kmeans = faiss.Kmeans(vectors.shape[1], num_classes, **options)
    kmeans.train(vectors, init_centroids=init_centroids)
    _, assignment = kmeans.index.search(vectors, 1)
    return normalized_mutual_info(codes, assignment[:, 0], average=average)


def normalized_mutual_info(
    labels: np.ndarray, clusters: np.ndarray, *, average: str = "arithmetic"
) -> float:
    """NMI with arithmetic normalisation, I(U; V) / ((H(U) + H(V)) / 2), or with
    ``average="geometric"`` I(U; V) / sqrt(H(U) H(V)), from the contingency table of two integer
    labellings (scikit-learn's normalized_mutual_info_score and its average_method, same limit
    cases: 1.0 when both put everything in one group, 0.0 when the mutual information is 0)."""
    _check_average(average)
    labels = np.asarray(labels).reshape(-1)
    clusters = np.asarray(clusters).reshape(-1)
    _, u = np.unique(labels, return_inverse=True)
    _, v = np.unique(clusters, return_inverse=True)
    u, v = u.reshape(-1), v.reshape(-1)
    n_u, n_v = int(u.max(initial=-1)) + 1, int(v.max(initial=-1)) + 1
    if n_u == n_v <= 1:
        return 1.0
    # the non-zero cells of the contingency table, without building it densely
    cells, counts = np.unique(u.astype(np.int64) * n_v + v, return_counts=True)
    rows, cols = cells // n_v, cells % n_v
    total = float(len(u))
    row_sums = np.bincount(u, minlength=n_u).astype(np.float64)
    col_sums = np.bincount(v, minlength=n_v).astype(np.float64)
    joint = counts / total
    log_outer = -np.log(row_sums[rows] * col_sums[cols]) + 2 * np.log(total)
    terms = joint * (np.log(counts) - np.log(total)) + joint * log_outer
    terms = np.where(np.abs(terms) < np.finfo(np.float64).eps, 0.0, terms)
    mutual = max(float(terms.sum()), 0.0)
    if mutual == 0.0:
        return 0.0
    h_u, h_v = _entropy(row_sums), _entropy(col_sums)
    normaliser = (h_u + h_v) / 2 if average == "arithmetic" else np.sqrt(h_u * h_v)
    return float(mutual / normaliser)


def _check_average(average: str) -> None:
    if average not in NMI_AVERAGES:
        raise NearsightError(
            f"NMI average must be one of {', '.join(NMI_AVERAGES)}, got {average!r}"
        )


def _entropy(counts: np.ndarray) -> float:
    counts = counts[counts > 0]
    if len(counts) <= 1:
        return 0.0
    total = counts.sum()
    return float(-np.sum((counts / total) * (np.log(counts) - np.log(total))))


def _kmeans_plusplus(vectors: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): each next centroid drawn with
    probability proportional to the squared distance to the nearest one chosen so far. A loop
    over the k centroids (the method is sequential), each step whole-array numpy."""
    rng = np.random.default_rng(seed)
    n = len(vectors)
    chosen = [int(rng.integers(n))]
    nearest = ((vectors - vectors[chosen[0]]) ** 2).sum(axis=1)
    for _ in range(1, k):
        total = nearest.sum()
        pick = int(rng.choice(n, p=nearest / total)) if total > 0 else int(rng.integers(n))
        chosen.append(pick)
        nearest = np.minimum(nearest, ((vectors - vectors[pick]) ** 2).sum(axis=1))
    return np.ascontiguousarray(vectors[chosen], dtype=np.float32)
