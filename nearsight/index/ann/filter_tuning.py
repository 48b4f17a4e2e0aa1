"""The measured parts of the filtered-search plan (nearsight.index.ann.filter_plan), made at build
time and stored in the gallery meta as ``filter_route``:

- :func:`tune_filters`: the widening rule's ``alpha``, the smallest of filter_plan.ALPHAS (and
  for PQ types, with it, the smallest of filter_plan.REFINES) for which the filtered walks reach
  filter_plan.TARGET_RECALL on held-out queries (index.ann.tuning's
  sample, before it is added) under every tuning filter: random items and items clustered away
  from the query (a cap along a random direction, groups of coarse and of fine k-means
  clusters counted on the queries outside them), each at 1%, 10% and 50% of the items. Every
  query whose plan walks counts; one the plan sends to the exact search does not (it gets the
  true answer).
- :func:`partition_for`: an HNSW gallery's coarse partition (nearsight.index.ann.coarse), its
  rule ``beta`` the smallest that reaches filter_plan.TARGET_RECALL under the same filters.
- :func:`calibrate`: this machine's costs of one query's exact search (at two allowed counts)
  and of one filtered walk (at two widths), fitted as ``a + b x size`` and recorded with the
  host's name; a gallery opened elsewhere measures them again in memory on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import faiss
import numpy as np

from nearsight.index.ann import coarse, filter_plan, filtered
from nearsight.index.ann.faiss_index import IVF_TYPES, PQ_TYPES
from nearsight.index.ann.filter_plan import Costs
from nearsight.index.ann.tuning import TUNING_K, recall_at_k

# half the items too: a group of categories away from the query spread its true neighbours
# over more lists than the 10% groups did (300k items, IVF-PQ: recall@10 0.925 at 50% with the
# rule tuned on 1% and 10% alone)
FILTER_SHARES = (0.01, 0.1, 0.5)
FILTER_QUERIES = 200
CALIBRATION_QUERIES = 16
# k-means clusters standing in for categories, coarse and fine: neither grain alone tuned a
# rule that kept a catalog's groups of categories at the target (bench/filtered_catalog.py)
TUNING_CLUSTERS = (64, 256)
BLOCK = 65_536  # rows per block of a scan over the items (bounded temporaries)


def tune_filters(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    vectors: np.ndarray,
    ids: np.ndarray,
    held_out: np.ndarray,
    target: float = filter_plan.TARGET_RECALL,
) -> dict[str, Any]:
    """``{"alpha", "tuned_recall", "target"}`` for the meta's ``filter_route``; {} for types
    searched exactly (flat) or galleries too small to need it. ``held_out``: the positions of
    ``vectors`` not in ``index`` yet, the queries; ``target``: the recall@10 the walks must
    reach (filter_plan.TARGET_RECALL, what a filtered search promises; tests pass others)."""
    if index_type not in (*IVF_TYPES, "hnsw") or len(held_out) < 20:
        return {}
    if len(vectors) < filter_plan.MIN_PLAN_ITEMS:
        return {}
    inside = np.ones(len(vectors), bool)
    inside[held_out] = False
    in_index = ids[inside]
    queries = np.ascontiguousarray(vectors[held_out[:FILTER_QUERIES]], np.float32)
    position = {"ids": ids}

    def vectors_of(wanted: np.ndarray) -> np.ndarray:
        return np.asarray(vectors[np.searchsorted(position["ids"], wanted)], np.float32)

    tests = []
    for allowed, counted in tuning_filters(vectors, inside, in_index, queries, seed=0):
        tests.append((allowed, counted, exact_top(queries, vectors_of, allowed, TUNING_K)))
    state = filtered.FilterState()
    refines = filter_plan.REFINES if index_type in PQ_TYPES else (1,)
    worst = 0.0
    for alpha in filter_plan.ALPHAS:
        trial = {**meta, "filter_route": {"alpha": alpha}}
        plans: dict[int, tuple[Any, np.ndarray]] = {}  # by test, made once for every refine
        for refine in refines:
            worst = 1.0
            for number, (allowed, counted, truth) in enumerate(tests):
                if number not in plans:
                    plans[number] = filtered.plan_walk(index, index_type, trial, queries,
                                                       TUNING_K, allowed, len(in_index), state)  # fmt: skip
                plan, work = plans[number]
                walk = (work > 0) & counted
                if not walk.any():
                    continue
                _, found = filtered.walk_index(index, index_type, queries, TUNING_K, allowed,
                                               vectors_of, plan, walk, refine)  # fmt: skip
                worst = min(worst, recall_at_k(found[:, :TUNING_K], truth[walk]))
                if worst < target:
                    break
            if worst >= target:
                return _rule(alpha, refine, worst, target, index_type)
    return _rule(filter_plan.ALPHAS[-1], refines[-1], worst, target, index_type)


def _rule(alpha: float, refine: int, worst: float, target: float, index_type: str) -> dict:
    rule = {"alpha": alpha, "tuned_recall": round(worst, 4), "target": target}
    return {**rule, "refine": refine} if index_type in PQ_TYPES else rule


def tuning_filters(
    vectors: np.ndarray, inside: np.ndarray, ids: np.ndarray, queries: np.ndarray, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(sorted allowed ids, the queries whose recall counts) of the tuning filters: random, a
    cap, and groups of coarse and of fine clusters (TUNING_CLUSTERS), at each FILTER_SHARES,
    among the rows ``inside`` marks (their ids ``ids``); no copy of those rows is made (at 10M
    items it would be 5 GB). A group of clusters counts only the queries whose own cluster is
    not in it, nor its nearest item's: the filter away from the query ("category = shoes"
    for the photo of a bag), where a walk must reach furthest (counting the queries inside
    it too, and one grain of cluster, let a group of categories away from the query reach
    recall@10 0.926 at 300k items and 0.917 at 50k, where a wider rule gives 0.978 and
    0.982)."""
    rng = np.random.default_rng(seed)
    along = (vectors @ rng.standard_normal(int(vectors.shape[1])).astype(np.float32))[inside]
    every = np.ones(len(queries), bool)
    nearest = _nearest_inside(vectors, inside, queries)
    out = []
    for share in FILTER_SHARES:
        count = max(TUNING_K, round(share * len(ids)))
        out.append((np.sort(rng.choice(ids, count, replace=False)), every))
        out.append((np.sort(ids[np.argsort(-along, kind="stable")[:count]]), every))
    for grain in TUNING_CLUSTERS:
        clusters = min(grain, max(2, len(ids) // 200))
        label, own = _clusters(vectors, inside, queries, clusters, seed)
        for share in FILTER_SHARES:
            count = max(TUNING_K, round(share * len(ids)))
            group, taken = [], 0
            for cluster in rng.permutation(clusters):
                group.append(cluster)
                taken += int((label == cluster).sum())
                if taken >= count:
                    break
            members = ids[np.isin(label, group)]
            # neither the query's cluster nor its nearest item's (a query near a cluster's
            # edge may have its nearest item across it, in the group: an easy case)
            away = ~np.isin(own, group) & ~np.isin(label[nearest], group)
            if len(members) >= TUNING_K and away.any():
                out.append((np.sort(members), away))
    return out


def tune_partition(
    partition: coarse.Partition,
    vectors: np.ndarray,
    ids: np.ndarray,
    held_out: np.ndarray,
    target: float = filter_plan.TARGET_RECALL,
) -> coarse.Partition | None:
    """The partition with the smallest of coarse.BETAS whose scans reach ``target`` recall@10
    on the held-out queries under every tuning filter (:func:`tuning_filters`; every query
    counts, whether or not the route would send it there), or None where none does."""
    inside = np.ones(len(vectors), bool)
    inside[held_out] = False
    in_index = ids[inside]
    queries = np.ascontiguousarray(vectors[held_out[:FILTER_QUERIES]], np.float32)

    def vectors_of(wanted: np.ndarray) -> np.ndarray:
        return np.asarray(vectors[np.searchsorted(ids, wanted)], np.float32)

    tests = [
        (allowed, counted, exact_top(queries, vectors_of, allowed, TUNING_K))
        for allowed, counted in tuning_filters(vectors, inside, in_index, queries, 0)
    ]
    for beta in coarse.BETAS:
        trial = coarse.Partition(partition.centroids, partition.list_of, beta)
        worst = 1.0
        for allowed, counted, truth in tests:
            plan = trial.plan(queries[counted], allowed, TUNING_K)
            found = np.stack([
                exact_top(queries[counted][q : q + 1], vectors_of, plan.ids(q, allowed),
                          TUNING_K)[0]
                for q in range(int(counted.sum()))
            ])  # fmt: skip
            worst = min(worst, recall_at_k(found, truth[counted]))
            if worst < target:
                break
        if worst >= target:
            return coarse.Partition(partition.centroids, partition.list_of, beta, round(worst, 4))
    return None


def partition_for(
    vectors: np.ndarray,
    ids: np.ndarray,
    held_out: np.ndarray,
    target: float = filter_plan.TARGET_RECALL,
) -> coarse.Partition | None:
    """The tuned coarse partition of a gallery's items (index.ann.coarse), or None (also for
    galleries whose filtered searches are all exact: under filter_plan.MIN_PLAN_ITEMS)."""
    if len(held_out) < 20 or len(vectors) < filter_plan.MIN_PLAN_ITEMS:
        return None
    return tune_partition(coarse.build_partition(vectors, ids), vectors, ids, held_out, target)


def _clusters(
    vectors: np.ndarray, inside: np.ndarray, queries: np.ndarray, clusters: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The k-means cluster of each inside row and of each query."""
    kmeans = faiss.Kmeans(vectors.shape[1], clusters, niter=5, seed=seed, spherical=True,
                          max_points_per_centroid=64)  # fmt: skip
    # the same sample k-means would draw from the inside rows (it keeps 64 per centroid)
    kmeans.train(np.ascontiguousarray(_sample_inside(vectors, inside, clusters * 64, seed)))
    label = np.concatenate([
        kmeans.index.search(np.ascontiguousarray(vectors[start : start + BLOCK], np.float32),
                            1)[1][:, 0]
        for start in range(0, len(vectors), BLOCK)
    ])[inside]  # fmt: skip
    own = kmeans.index.search(np.ascontiguousarray(queries, np.float32), 1)[1][:, 0]
    return label, own


def _nearest_inside(vectors: np.ndarray, inside: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Per query, the position among the rows ``inside`` marks of its nearest one (the
    largest inner product), BLOCK rows at a time."""
    best = np.full(len(queries), -np.inf, np.float32)
    where = np.zeros(len(queries), np.int64)
    before = 0  # inside rows in the blocks already read
    queries = np.asarray(queries, np.float32)
    for start in range(0, len(vectors), BLOCK):
        marked = inside[start : start + BLOCK]
        rows = np.asarray(vectors[start : start + BLOCK][marked], np.float32)
        if len(rows):
            scores = queries @ rows.T
            top = scores.argmax(axis=1)
            value = scores[np.arange(len(queries)), top]
            better = value > best
            best[better], where[better] = value[better], before + top[better]
        before += int(marked.sum())
    return where


def _sample_inside(vectors: np.ndarray, inside: np.ndarray, most: int, seed: int) -> np.ndarray:
    """The rows ``inside`` marks, or past ``most`` of them the ``most`` that faiss.Kmeans
    (seed ``seed``) would itself draw from them (its ``rand_perm``): the same centroids,
    without a copy of every inside row."""
    rows = np.flatnonzero(inside)
    if len(rows) > most:
        perm = np.empty(len(rows), np.int32)
        # in faiss's SWIG module, missing from its stubs
        faiss.rand_perm(faiss.swig_ptr(perm), len(rows), seed)  # type: ignore[attr-defined]
        rows = rows[perm[:most]]
    return np.asarray(vectors[rows], np.float32)


def exact_top(
    queries: np.ndarray, vectors_of: filtered.VectorsOf, allowed: np.ndarray, k: int
) -> np.ndarray:
    """The ids [Q, min(k, allowed)] of the queries' top inner products among the sorted
    ``allowed`` ids, best first, ties by the lower id (a stable sort of all the scores), made
    BLOCK items at a time: a running top-k, never a [Q, allowed] matrix."""
    best = np.empty((len(queries), 0), np.float32)
    best_ids = np.empty((len(queries), 0), np.int64)
    for start in range(0, len(allowed), BLOCK):
        block = allowed[start : start + BLOCK]
        scores = np.concatenate([best, queries @ vectors_of(block).T], axis=1)
        ids = np.concatenate([np.broadcast_to(best_ids, best.shape),
                              np.broadcast_to(block, (len(queries), len(block)))], axis=1)  # fmt: skip
        best, best_ids = top_rows(scores, ids, k)
    return best_ids


def top_rows(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k best (scores, ids), ties in column order (ids rise along a row): what
    a stable argsort of ``-scores`` keeps, with a partition first to sort only those that
    can be in it (every score tied with the k-th is kept)."""
    k = min(k, scores.shape[1])
    if scores.shape[1] > k:
        kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]
        out_scores = np.empty((len(scores), k), scores.dtype)
        out_ids = np.empty((len(scores), k), np.int64)
        for row, (values, keys) in enumerate(zip(scores, ids, strict=True)):
            near = np.flatnonzero(values >= kth[row])
            order = near[np.argsort(-values[near], kind="stable")[:k]]
            out_scores[row], out_ids[row] = values[order], keys[order]
        return out_scores, out_ids
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


def calibrate(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    ids: np.ndarray,
    vectors_of: filtered.VectorsOf,
    rows_of: filtered.RowsOf | None,
) -> Costs:
    """This machine's costs (module docstring), timed on the gallery's own items."""
    rng = np.random.default_rng(1)
    queries = np.ascontiguousarray(
        vectors_of(np.sort(rng.choice(ids, min(len(ids), CALIBRATION_QUERIES), replace=False)))
    )
    points: list[tuple[float, float]] = []
    for size in (min(len(ids), 1000), min(len(ids), 32_000)):
        allowed = np.sort(rng.choice(ids, size, replace=False))
        points.append((size, _per_query(
            lambda q, allowed=allowed: filtered.exact_search(q, vectors_of, allowed, TUNING_K,
                                                             rows_of), queries)))  # fmt: skip
    exact = filter_plan.fit(points)
    walk, per_allowed, plan, gate = (0.0, 0.0), 0.0, 0.0, 0.0
    if index_type == "hnsw" or index_type in IVF_TYPES:
        walk = filter_plan.fit(_walk_points(index, index_type, meta, ids, vectors_of, queries))
        per_allowed = _per_allowed(index, index_type, ids)
    if index_type == "hnsw":  # its probe (IVF's plan is in the walk's fixed cost)
        probe = max(int(meta.get("ef_search", 64)), filter_plan.LOCAL_PROBE)
        allowed = np.sort(rng.choice(ids, max(1, len(ids) // 10), replace=False))
        plan = _per_query(lambda q: filter_plan.local_share(index, q, allowed, probe), queries)
        gate = _per_query(
            lambda q: filter_plan.local_share(index, q, allowed, filter_plan.GATE_PROBE), queries
        )
    return Costs(exact[0], exact[1], walk[0], walk[1], walk_per_allowed=per_allowed, plan=plan,
                 gate=gate)  # fmt: skip


def _per_allowed(index: faiss.Index, index_type: str, ids: np.ndarray) -> float:
    """ms per allowed item of what a walk does with every allowed id: its selector bitmap
    and (IVF) the count of allowed items per list."""
    allowed = np.sort(ids)
    state = filtered.FilterState()
    if index_type in IVF_TYPES:
        filtered.lists_of(index, state)

    def run() -> None:
        filtered.id_bitmap(allowed)
        if state.list_of is not None:
            np.bincount(state.list_of[allowed])

    run()
    return min(filter_plan.median_ms(run, 1) for _ in range(3)) / max(1, len(allowed))


def _walk_points(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    ids: np.ndarray,
    vectors_of: filtered.VectorsOf,
    queries: np.ndarray,
) -> list[tuple[float, float]]:
    """(work, ms) of one filtered walk at two widths, its selector admitting a random
    tenth of the items (its bitmap's cost, which grows with the allowed count, is
    :func:`_per_allowed`'s)."""
    rng = np.random.default_rng(2)
    allowed = np.sort(rng.choice(ids, max(1, len(ids) // 10), replace=False))
    one = np.ones(1, bool)
    points: list[tuple[float, float]] = []
    if index_type == "hnsw":
        ef = int(meta.get("ef_search", 64))
        for width in (ef, 16 * ef):
            plan = np.array([width])
            points.append((width, _per_query(
                lambda q, plan=plan: filtered.walk_index(index, index_type, q, TUNING_K, allowed,
                                                         vectors_of, plan, one), queries)))  # fmt: skip
        return points
    ivf = faiss.extract_index_ivf(index)
    state = filtered.FilterState()
    filtered.lists_of(index, state)
    list_sizes = state.list_sizes
    assert list_sizes is not None, "filtered.lists_of sets it"
    nprobe = int(meta.get("nprobe", 8))
    refine = filter_plan.Rule.from_meta(meta).refine  # PQ: as many re-ranked as it walks with
    for width in (nprobe, min(int(ivf.nlist), 16 * nprobe)):
        works: list[int] = []

        def run(q: np.ndarray, width: int = width, works: list[int] = works) -> None:
            rotated = filtered.rotate(index, index_type, q)
            scores, order = ivf.quantizer.search(rotated, int(ivf.nlist))
            lists = [order[0, :width]]
            works.append(int(list_sizes[lists[0]].sum()))
            filtered.walk_index(index, index_type, q, TUNING_K, allowed, vectors_of,
                                (rotated, scores, order, lists), one, refine)  # fmt: skip

        ms = _per_query(run, queries)
        points.append((float(np.mean(works)), ms))
    return points


def _per_query(run: Any, queries: np.ndarray) -> float:
    """Median over the queries of the fastest of three ``run(query[None])`` (after one
    warm-up): the fastest, as other processes' load only ever adds time."""
    run(queries[:1])

    def on(q: np.ndarray) -> Callable[[], Any]:
        return lambda: run(q[None])

    times = [min(filter_plan.median_ms(on(q), 1) for _ in range(3)) for q in queries]
    return float(np.median(times))
