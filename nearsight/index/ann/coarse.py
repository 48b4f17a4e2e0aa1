"""A coarse partition stored with an HNSW gallery, for the exact way of its filtered searches.

Where a filter's allowed items lie away from the query (a category far from the photo's own,
a region of the space), HNSW's filtered walk cannot promise the recall target and the query is
searched exactly over every allowed item (nearsight.index.ann.filtered). With a partition, that
scan reads only the allowed items of the lists nearest the query: an IVF-Flat walk over the
stored float vectors restricted to the allowed ids (FAISS's IVF search with an IDSelector and
``SearchParametersIVF``, with the lists ordered by the query's inner product with their
centroids and the count of allowed items in each known before any is read, as Qdrant plans from
its payload index's cardinalities), then the exact top-k of what it read.

The partition: spherical k-means centroids (about sqrt(N) lists) and each item's list, no
second copy of the vectors, in ``partition.npz`` beside the index (:func:`build_partition`,
tuned by filter_tuning.partition_for at build; :func:`read_partition` on open). A query reads
the lists holding allowed items, nearest first, until they hold ``beta x`` the mean list's size
of allowed items (and at least the depth asked); ``beta`` is the smallest of BETAS for which
those scans reach filter_plan.TARGET_RECALL on the build's held-out queries under every tuning
filter of filter_tuning.tuning_filters. No beta reaching it: no partition is stored. Items
added after the build are in no list and always read; a gallery without the file searches as
before.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from nearsight.index.ann import filter_plan

PARTITION_FILE = "partition.npz"
BETAS = (4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0)  # x the mean list
MIN_LISTS = 8
KMEANS_ITERATIONS = 10
KMEANS_POINTS_PER_LIST = 64  # k-means trains on a sample of this many items per list
BLOCK = 65_536  # items assigned at a time
# (queries [1, D], sorted ids, depth) -> their exact top: filtered_exact.exact_search, bound
ExactSearch = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


@dataclass
class Partition:
    """``centroids`` [nlist, D]; ``list_of``: each id's list (index = id, -1: none);
    ``beta``: the tuned rule; ``tuned_recall``: the recall@10 it gave at build."""

    centroids: np.ndarray
    list_of: np.ndarray
    beta: float = BETAS[-1]
    tuned_recall: float | None = None
    # ms per allowed id of a query's passes over them (planning its lists, selecting what it
    # reads), measured on this machine on first use (:meth:`selection_ms`)
    per_allowed_ms: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        listed = self.list_of >= 0
        self._listed = int(listed.sum())
        # each id's list, nlist for none: one gather per search (a narrower type, fewer bytes)
        kind = np.int16 if self.nlist < np.iinfo(np.int16).max else np.int32
        self._list_index = np.where(listed, self.list_of, self.nlist).astype(kind)

    @property
    def nlist(self) -> int:
        return len(self.centroids)

    def mean_list(self) -> float:
        return max(1.0, self._listed / self.nlist)

    def reads(self, depth: int) -> float:
        """The allowed items a query's rule reads (its lists' last one may add more)."""
        return max(self.beta * self.mean_list(), float(depth))

    def can_pay(self, allowed: int) -> bool:
        """Whether a scan of the nearest lists reads well under the allowed count."""
        return 2 * self.beta * self.mean_list() < allowed

    def plan(self, queries: np.ndarray, allowed: np.ndarray, depth: int) -> CoarsePlan:
        """Per query, the lists to read (nearest first, holding allowed items, until they
        hold ``beta x mean list`` of them and at least ``depth``) and how many items that is."""
        lists = self.lists(allowed)
        held = np.bincount(lists, minlength=self.nlist + 1)
        scores = np.asarray(queries, np.float32) @ self.centroids.T
        order = np.argsort(-scores, axis=1)
        covered = np.cumsum(held[order], axis=1)
        target = self.reads(depth)
        count = np.minimum((covered < target).sum(axis=1) + 1, self.nlist)
        scanned = covered[np.arange(len(order)), count - 1] + held[self.nlist]
        return CoarsePlan(lists, order, count, scanned.astype(np.int64))

    def lists(self, allowed: np.ndarray) -> np.ndarray:
        """Each allowed id's list; nlist for ids in none (added after the build)."""
        if not len(allowed) or allowed[-1] < len(self._list_index):
            return self._list_index[allowed]
        out = np.full(len(allowed), self.nlist, self._list_index.dtype)
        known = allowed < len(self._list_index)
        out[known] = self._list_index[allowed[known]]
        return out

    def selection_ms(self) -> float:
        """ms per allowed id of a query's passes over the allowed ids, timed once on a random
        tenth of the listed items (the stored costs were timed before the partition)."""
        if self.per_allowed_ms is None:
            listed = np.flatnonzero(self.list_of >= 0)
            rng = np.random.default_rng(0)
            allowed = np.sort(rng.choice(listed, max(1, len(listed) // 10), replace=False))
            query = self.centroids[:1]

            def run() -> None:
                self.plan(query, allowed, 1).ids(0, allowed)

            run()
            best = min(filter_plan.median_ms(run, 1) for _ in range(3))
            self.per_allowed_ms = best / len(allowed)
        return self.per_allowed_ms


@dataclass
class CoarsePlan:
    lists: np.ndarray  # each allowed id's list (nlist: always read)
    order: np.ndarray  # [Q, nlist] the lists, nearest first
    count: np.ndarray  # [Q] how many of them each query reads
    scanned: np.ndarray  # [Q] the allowed items each query reads

    def ids(self, query: int, allowed: np.ndarray) -> np.ndarray:
        """The sorted allowed ids query ``query`` reads."""
        chosen = np.zeros(self.order.shape[1] + 1, bool)
        chosen[self.order[query, : self.count[query]]] = True
        chosen[-1] = True
        return allowed[chosen[self.lists]]


def build_partition(vectors: np.ndarray, ids: np.ndarray, seed: int = 0) -> Partition:
    """Spherical k-means of ``vectors`` (row i: id ``ids[i]``) into about sqrt(N) lists, and
    each item's list (untuned: the widest rule)."""
    count, dim = vectors.shape
    nlist = max(MIN_LISTS, round(math.sqrt(count)))
    nlist = min(nlist, max(1, count // 4))
    rng = np.random.default_rng(seed)
    most = nlist * KMEANS_POINTS_PER_LIST
    rows = np.sort(rng.choice(count, most, replace=False)) if count > most else np.arange(count)
    kmeans = faiss.Kmeans(dim, nlist, niter=KMEANS_ITERATIONS, seed=seed, spherical=True,
                          max_points_per_centroid=KMEANS_POINTS_PER_LIST)  # fmt: skip
    kmeans.train(np.ascontiguousarray(vectors[rows], np.float32))
    assigned = np.concatenate([
        kmeans.index.search(np.ascontiguousarray(vectors[start : start + BLOCK], np.float32),
                            1)[1][:, 0]
        for start in range(0, count, BLOCK)
    ])  # fmt: skip
    list_of = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, np.int32)
    list_of[ids] = assigned
    return Partition(np.ascontiguousarray(kmeans.centroids, np.float32), list_of)


def scan(
    plan: CoarsePlan, queries: np.ndarray, allowed: np.ndarray, depth: int, search: ExactSearch
) -> tuple[np.ndarray, np.ndarray]:
    """(inner products, ids) [Q, depth]: the exact top ``depth`` of what each query reads as
    ``plan`` (made for these queries) says, by ``search`` (filtered_exact.exact_search with
    the gallery's vectors bound)."""
    inner = np.full((len(queries), depth), -np.inf, np.float32)
    found = np.full((len(queries), depth), -1, np.int64)
    for q in range(len(queries)):
        inner[q], found[q] = search(queries[q : q + 1], plan.ids(q, allowed), depth)
    return inner, found


def write_partition(folder: str | os.PathLike[str], partition: Partition) -> None:
    path = Path(folder) / PARTITION_FILE
    with open(path, "wb") as handle:
        np.savez(handle, centroids=partition.centroids, list_of=partition.list_of,
                 rule=np.array([partition.beta, partition.tuned_recall or 0.0]))  # fmt: skip
        handle.flush()
        os.fsync(handle.fileno())


def read_partition(folder: str | os.PathLike[str]) -> Partition | None:
    """The folder's partition, or None where it has none (built before partitions)."""
    path = Path(folder) / PARTITION_FILE
    if not path.is_file():
        return None
    with np.load(path) as stored:
        rule = stored["rule"]
        return Partition(stored["centroids"], stored["list_of"], float(rule[0]), float(rule[1]))
