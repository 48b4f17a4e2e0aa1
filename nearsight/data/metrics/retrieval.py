"""Retrieval metrics of the deep-metric-learning papers: Recall@k, MAP@R and NMI.

Protocol (all papers): the evaluation split is the gallery and every item queries all the
others.

- Recall@k: share of queries with at least one item of their class among their k nearest
  neighbours, the query itself excluded (Oh Song et al. 2016, "Deep Metric Learning via Lifted
  Structured Feature Embedding"). Every query counts, including one whose class has no other
  item: it can only miss. (pytorch-metric-learning's precision_at_1 drops such "lone" queries;
  on CUB, CARS and SOP there are none, so the numbers agree.)
- MAP@R (Musgrave, Belongie & Lim 2020, "A Metric Learning Reality Check", sec. 3.2): for a query
  with R other items of its class, AP@R = (1/R) sum_{i=1..R} P(i) rel(i), where rel(i) = 1 if
  the i-th neighbour is of the query's class and P(i) is the precision among the first i
  neighbours; MAP@R is the mean over queries. Queries with R = 0 are excluded (AP@R is undefined
  for them; pytorch-metric-learning drops them too); with no query left the result is NaN.
- NMI: k-means on the embeddings (faiss; k = number of classes; k-means++ seeding, as in the
  MATLAB and scikit-learn k-means of the original evaluation code; fixed seed), then the
  normalised mutual information between the cluster assignment and the labels, arithmetic
  normalisation (scikit-learn's normalized_mutual_info_score, computed here in numpy from the
  contingency table: tests/data/test_metrics.py checks it against scikit-learn to 1e-10). Papers
  differ here: most (RankMI, RLL) divide by the arithmetic mean of the two entropies, the
  balanced contrastive paper by their geometric mean; ``nmi_average="geometric"`` gives that.

Neighbours come from exact (brute-force) inner-product search: the embeddings are L2 normalised,
so inner product ranks like cosine similarity and like Euclidean distance. For a chunk of
queries, faiss.knn against the whole gallery (BLAS blocks + a heap per query; faiss.knn_gpu on a
GPU that FAISS sees), k + 1 deep. The query is excluded by id, not by position: with duplicate
vectors the query may not come first, so its own id is dropped wherever it appears among the
k + 1, else (tied duplicates pushed it out) the last one. Work is done in chunks of queries (4096:
faiss blocks the scores itself, 4096 x 4096 at a time here, and every block is one OpenMP region, so
that small chunks multiply the regions, which a loaded CPU makes slow) and at most
_MAX_RESULTS_PER_CHUNK neighbour ids (chunk * (k + 1)) at once, never O(N^2); the gallery itself
may be a memory map: evaluation past the memory budget stays exact.
Ties: items with exactly equal scores (duplicate vectors) come in the order faiss returns them,
which is unspecified; the metrics change only if tied items of different classes straddle the
k-th rank (or the R-th, for MAP@R).

This module imports neither torch nor scikit-learn nor scipy: ``nearsight eval`` is on the
serving path. bench/search.py times it against pytorch-metric-learning's AccuracyCalculator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import faiss
import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.metrics.exclude import without_keys
from nearsight.data.metrics.inputs import prepare_embeddings
from nearsight.data.metrics.nmi import nmi

CUB_KS: tuple[int, ...] = (1, 2, 4, 8)  # CUB-200-2011, CARS196
SOP_KS: tuple[int, ...] = (1, 10, 100, 1000)  # Stanford Online Products
# default_ks switches to SOP_KS from this gallery size on (SOP's test split has 60,502 images,
# CUB's 5,924 and CARS196's 8,131): k = 1000 means nothing on a small gallery, and k <= 8
# saturates less on a large one. Callers that know the dataset should pass ks themselves.
SOP_SCALE_ITEMS = 20_000
# gallery rows per faiss BLAS block (faiss's default: 1024): 4096 x 4096 scores (64 MB) per
# block halve the per-block overhead; see docs/decisions.md
_DATABASE_BLOCK = 4096
# upper bound on neighbour ids held at once (chunk * (k + 1)): ~100 MB with ids and distances
_MAX_RESULTS_PER_CHUNK = 1 << 23


def default_ks(num_items: int) -> tuple[int, ...]:
    """(1, 2, 4, 8) for CUB/CARS-size galleries, (1, 10, 100, 1000) from SOP_SCALE_ITEMS on."""
    return SOP_KS if num_items >= SOP_SCALE_ITEMS else CUB_KS


def recall_at_k(
    embeddings: np.ndarray,
    labels: Sequence | np.ndarray,
    ks: Sequence[int] = CUB_KS,
    *,
    chunk: int = 4096,
) -> dict[int, float]:
    """Recall@k for each k in ``ks``: {k: share of queries with a same-class item in the top k}.
    A k larger than N - 1 is evaluated on all N - 1 other items."""
    vectors, codes = prepare_embeddings(embeddings, labels)
    ks = _check_ks(ks)
    recalls, _ = _retrieval_scores(vectors, codes, ks, with_map=False, chunk=chunk)
    return recalls


def map_at_r(embeddings: np.ndarray, labels: Sequence | np.ndarray, *, chunk: int = 4096) -> float:
    """MAP@R (Musgrave et al. 2020); queries whose class has no other item are excluded."""
    vectors, codes = prepare_embeddings(embeddings, labels)
    _, mean_ap = _retrieval_scores(vectors, codes, (), with_map=True, chunk=chunk)
    return mean_ap


def evaluate(
    embeddings: np.ndarray,
    labels: Sequence | np.ndarray,
    ks: Sequence[int] = CUB_KS,
    *,
    chunk: int = 4096,
    seed: int = 0,
    nmi_init: str = "k-means++",
    queries: int | None = None,
    reorder: Reorder | None = None,
    reorder_depth: int = 0,
    with_nmi: bool = True,
    nmi_average: str = "arithmetic",
) -> dict[str, float | int]:
    """All metrics in the `nearsight eval --json` shape:
    {"recall@1": ..., "recall@2": ..., ..., "nmi": ..., "map@r": ..., "queries": Q}.
    Recall@k and MAP@R share one neighbour search; ``seed`` and ``nmi_init`` go to :func:`nmi`.
    ``queries``: score only a random sample of that many queries (drawn with ``seed``), each
    still searching all N - 1 other items exactly: unbiased estimates of Recall@k and MAP@R at
    Q / N of the O(N^2) cost. NMI always clusters the whole gallery (k-means is O(N)).
    ``reorder(query_rows, neighbour_rows)``: re-ranks each query's ``reorder_depth`` (or more)
    nearest other rows before scoring (nearsight.search.rerank); NMI is unaffected."""
    vectors, codes = prepare_embeddings(embeddings, labels)
    ks = _check_ks(ks)
    query_ids = _sample_queries(len(vectors), queries, seed)
    recalls, mean_ap = _retrieval_scores(
        vectors,
        codes,
        ks,
        with_map=True,
        chunk=chunk,
        query_ids=query_ids,
        reorder=reorder,
        reorder_depth=reorder_depth,
    )
    result: dict[str, float | int] = {f"recall@{k}": value for k, value in recalls.items()}
    if with_nmi:  # without: the retrieval metrics only (tuning a re-ranking)
        result["nmi"] = nmi(vectors, codes, seed=seed, init=nmi_init, average=nmi_average)
    result["map@r"] = mean_ap
    result["queries"] = len(vectors) if query_ids is None else len(query_ids)
    return result


# ---------------------------------------------------------------- internals


def _sample_queries(n: int, queries: int | None, seed: int) -> np.ndarray | None:
    """Sorted ids of ``queries`` distinct items drawn with ``seed``; None: every item queries."""
    if queries is None or queries >= n:
        return None
    if queries < 1:
        raise NearsightError(f"the number of queries must be positive, got {queries}")
    return np.sort(np.random.default_rng(seed).choice(n, size=queries, replace=False))


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks):
        raise NearsightError(f"k values must be positive integers, got {list(ks)}")
    return ks


def _retrieval_scores(
    vectors: np.ndarray,
    codes: np.ndarray,
    ks: tuple[int, ...],
    *,
    with_map: bool,
    chunk: int,
    query_ids: np.ndarray | None = None,
    reorder: Reorder | None = None,
    reorder_depth: int = 0,
) -> tuple[dict[int, float], float]:
    """({k: Recall@k}, MAP@R or NaN) from one chunked exact kNN pass over the queries
    (``query_ids``, default every item), each against all other items."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    n = len(vectors)
    index = _ExactIP(vectors)

    k_recall = min(max(ks), n - 1) if ks else 0
    others_of_class = np.bincount(codes)[codes] - 1  # R per query
    # MAP@R needs R neighbours: process queries by increasing R so that a chunk searches only
    # as deep as its own largest R.
    pool = np.arange(n) if query_ids is None else query_ids
    order = pool[np.argsort(others_of_class[pool], kind="stable")] if with_map else pool
    num_queries = len(order)
    first_hit_counts = np.zeros(k_recall + 1, dtype=np.int64)  # rank of first same-class item
    # per-query AP (NaN where R = 0), averaged at the end: the sum is the same for any chunking
    average_precision = np.full(n, np.nan)

    start = 0
    while start < num_queries:
        end = min(start + chunk, num_queries)
        depth = _depth(k_recall, others_of_class, order, end, with_map)
        end = min(end, start + max(1, _MAX_RESULTS_PER_CHUNK // (depth + 1)))
        depth = _depth(k_recall, others_of_class, order, end, with_map)
        queries = order[start:end]
        if reorder is None:
            neighbours = _neighbours_without_self(index, vectors, queries, depth)
        else:
            wide = min(max(depth, reorder_depth), n - 1)
            neighbours = reorder(queries, _neighbours_without_self(index, vectors, queries, wide))
            neighbours = neighbours[:, :depth]
        same_class = codes[neighbours] == codes[queries][:, None]  # [q, depth]

        if k_recall:
            top = same_class[:, :k_recall]
            first = np.where(top.any(axis=1), top.argmax(axis=1), k_recall)
            first_hit_counts += np.bincount(first, minlength=k_recall + 1)
        if with_map:
            r = others_of_class[queries]
            ranks = np.arange(1, depth + 1)
            relevant = same_class & (ranks[None, :] <= r[:, None])
            precision = np.cumsum(relevant, axis=1) / ranks[None, :]
            with np.errstate(invalid="ignore", divide="ignore"):  # R = 0 -> NaN, excluded
                average_precision[queries] = (precision * relevant).sum(axis=1) / r
        start = end

    hits_within = np.cumsum(first_hit_counts)  # hits_within[j]: first hit at rank <= j + 1
    recalls = {k: float(hits_within[min(k, k_recall) - 1] / num_queries) for k in ks}
    scored = average_precision[~np.isnan(average_precision)]
    mean_ap = float(scored.mean()) if len(scored) else float("nan")
    return recalls, mean_ap


# (query rows [Q], their nearest other rows [Q, N]) -> the rows re-ordered [Q, N]
Reorder = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _depth(k_recall: int, r: np.ndarray, order: np.ndarray, end: int, with_map: bool) -> int:
    """How many neighbours the chunk ending at ``end`` (of queries sorted by R) needs."""
    if not with_map:
        return k_recall
    return max(k_recall, int(r[order[end - 1]]), 1)


class _ExactIP:
    """Exact inner-product kNN over a fixed gallery with faiss.IndexFlatIP's ``search``
    contract (scores and ids [nq, k], best first), on the GPU when FAISS sees one. The caller
    bounds nq so that the nq x N scores fit in memory."""

    def __init__(self, vectors: np.ndarray) -> None:
        self.gallery = vectors  # float32 C-contiguous; may be read-only (a memory map)
        self.gpu = _gpu_resources()

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.ascontiguousarray(queries, dtype=np.float32)
        if self.gpu is not None and k <= 2048:  # the GPU k-selection limit
            return faiss.knn_gpu(self.gpu, rows, self.gallery, k, metric=faiss.METRIC_INNER_PRODUCT)
        with _blas_database_block(_DATABASE_BLOCK):
            return faiss.knn(rows, self.gallery, k, metric=faiss.METRIC_INNER_PRODUCT)


@contextlib.contextmanager
def _blas_database_block(rows: int) -> Iterator[None]:
    """faiss's BLAS kNN scores query blocks against ``rows`` gallery rows at a time (a global
    of faiss, default 1024; restored afterwards). Only the speed changes, never the result."""
    previous = faiss.cvar.distance_compute_blas_database_bs
    faiss.cvar.distance_compute_blas_database_bs = max(previous, rows)
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_database_bs = previous


def _gpu_resources():
    """FAISS GPU resources when FAISS was built with CUDA and sees a GPU, else None."""
    try:
        if hasattr(faiss, "knn_gpu") and faiss.get_num_gpus() > 0:
            return faiss.StandardGpuResources()
    except (RuntimeError, AttributeError):
        pass
    return None


def _neighbours_without_self(
    index: _ExactIP, vectors: np.ndarray, queries: np.ndarray, k: int
) -> np.ndarray:
    """Ids [len(queries), k] of each query's k nearest neighbours, the query itself excluded.
    Searches k + 1 and drops the query's own id wherever it is (duplicates of the query may
    rank before it); where it is absent (tied duplicates pushed it out), drops the last."""
    _, ids = index.search(vectors[queries], k + 1)
    return without_keys(queries, ids)[0]
