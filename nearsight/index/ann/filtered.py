"""Search restricted to a set of ids (a filter's matches), on every index type.

Each query goes the cheaper of two ways that meet the recall target (the plan, the stored
widening rule and the per-machine costs: nearsight.index.ann.filter_plan; a walk is planned
only where planning it can pay: its cost and, per filter, whether most of its planned queries
repaid their plan so far, filter_plan.PlanHistory):

- **exact**: the inner products of the query with the allowed items' vectors only
  (``knn_inner_products_by_idx`` on the stored rows, no copy; a gathered copy where the
  vectors are not one array): the true top-k, at a cost linear in the allowed count (Qdrant's
  full scan under its cardinality threshold, Weaviate's ``flatSearchCutoff``, without their
  fixed count); for HNSW with a stored coarse partition (nearsight.index.ann.coarse), the
  same over only the allowed items of the k-means lists nearest the query, where that costs
  less (info ``coarse``): the recall target by the partition's rule, tuned at build;
- **the index**, with an ``IDSelectorBitmap`` so that it skips the other items while it
  searches (not a post-filter that would leave fewer than k):

  - hnsw: ``SearchParametersHNSW(sel, efSearch)``, efSearch widened by the filter's share near
    the query (filter_plan.hnsw_ef); no allowed item near the query: exact;
  - ivf, ivfpq, opq: the lists that hold allowed items, nearest first, until they hold enough
    of them (filter_plan.ivf_lists), searched with ``search_preassigned`` and
    ``SearchParametersIVF(sel)`` (opq: the query rotated first, the IVF index behind it);
  - flat: always exact (a selector scan reads every item).

  PQ types take REFINE_FACTOR x k candidates (at least REFINE_MIN), times the rule's tuned
  ``refine`` (filter_plan.REFINES), in the codes' order and re-rank them by the exact vectors,
  as their unfiltered searches do (index.ann.tuning.refine).
  A query that still came back with fewer than min(k, allowed) items is searched again exactly.

Distances are the exact inner products of the items returned, except in a PQ gallery without
exact vectors (codes only: no embeddings.npy and no vector source): it is searched through the
index in the codes' order (nprobe widened by N / allowed), short rows completed over the
decoded codes, its inner products those of the decoded codes, and its answer carries a note
that the recall target is not promised.

Removed items never come back: ``allowed`` holds live ids only (Gallery.search intersects it
with the catalog's ids), so no removed-items selector is needed beside this one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import faiss
import numpy as np

from nearsight.index.ann import coarse, filter_plan
from nearsight.index.ann.faiss_index import IVF_TYPES, PQ_TYPES
from nearsight.index.ann.filter_plan import TARGET_RECALL, Costs, Rule
from nearsight.index.ann.filtered_exact import (  # the exact way, here for its callers
    RowsOf,
    VectorsOf,
    complete_rows,
    exact_search,
)
from nearsight.index.ann.filtered_exact import rows_in as rows_in  # Gallery's, re-exported
from nearsight.index.ann.tuning import refine, refine_candidates

# "exact" / "index" / "coarse" (HNSW's partition): every filtered query that way (tests and
# bench/filtered_search.py compare the ways); None: the plan's choice
FORCE: str | None = None
CODES_ONLY_NOTE = (
    "recall target not promised: a filtered search of a PQ gallery without its exact vectors "
    "ranks by the compressed codes"
)


@dataclass
class FilterState:
    """What an open gallery keeps for its filtered searches: the costs and, for IVF types,
    the inverted list of every id. Costs stored for another host are measured again on first
    use (``calibrate``); a gallery with none stored (built before the plan) takes
    :func:`default_costs`, the same in every process."""

    costs: Costs | None = None
    calibrate: Callable[[], Costs] | None = None
    list_of: np.ndarray | None = None  # list number by id (-1: none)
    list_sizes: np.ndarray | None = None
    partition: coarse.Partition | None = None  # HNSW: the stored coarse partition, if any
    last: dict[str, Any] = field(default_factory=dict)
    history: filter_plan.PlanHistory = field(default_factory=filter_plan.PlanHistory)

    def machine_costs(self) -> Costs:
        if self.costs is None:
            self.costs = self.calibrate() if self.calibrate else default_costs()
            self.calibrate = None
        return self.costs


def default_costs() -> Costs:
    """Costs of the 2-core development machine (bench/filtered_search.py), for a search with
    no gallery to measure on."""
    return Costs(0.02, 5e-5, 0.05, 2e-4, host="")


def search_allowed(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    queries: np.ndarray,
    depth: int,
    allowed: np.ndarray,
    total: int,
    vectors_of: VectorsOf,
    *,
    exact_vectors: bool = True,
    rows_of: RowsOf | None = None,
    state: FilterState | None = None,
    info: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(inner products, ids) [Q, depth] of the ``depth`` <= len(allowed) nearest allowed items
    (sorted int64 ids, all live, fewer than the ``total`` items), best first. ``vectors_of``:
    the items' vectors (Gallery.vectors_of); ``exact_vectors``: whether those are the vectors
    added (False: decoded PQ codes, see the module docstring); ``rows_of``: the stored rows
    of ids, for an exact search without a copy; ``state``: the gallery's FilterState;
    ``info``: filled with how the queries went (``exact``/``index`` counts, ``notes``)."""
    info = {} if info is None else info
    info.update(exact=0, index=0, notes=[])
    if not exact_vectors:
        info["index"] = len(queries)
        info["notes"].append(CODES_ONLY_NOTE)
        return codes_only_search(index, index_type, meta, queries, depth, allowed, total,
                                 vectors_of)  # fmt: skip
    state = state or FilterState()
    walk = np.zeros(len(queries), bool)
    plan: Any = None
    # HNSW with a stored partition: the exact way reads only the lists nearest the query
    # (nearsight.index.ann.coarse), where that reads well under the allowed items; planned
    # only for the queries that take it
    partition = state.partition if index_type == "hnsw" and FORCE != "exact" else None
    if partition is not None and not (FORCE == "coarse" or (
            total >= filter_plan.MIN_PLAN_ITEMS and partition.can_pay(len(allowed)))):  # fmt: skip
        partition = None
    walkable = index_type == "hnsw" or index_type in IVF_TYPES
    if walkable and FORCE not in ("exact", "coarse") and (
            total >= filter_plan.MIN_PLAN_ITEMS or FORCE):  # fmt: skip
        costs = state.machine_costs()
        exact_ms, count = costs.exact(len(allowed)), len(allowed)
        if partition is not None:  # the cheaper exact way
            exact_ms = min(exact_ms, coarse_ms(costs, partition, count, depth))
        narrowest = costs.gate + costs.plan + costs.walk(narrowest_walk(index_type, meta, total),
                                                         count)  # fmt: skip
        # the filter's history, where a plan can pay at all (FORCE is None or "index" here)
        key = (filter_plan.PlanHistory.key(allowed, total)
               if not FORCE and exact_ms > narrowest else None)  # fmt: skip
        if FORCE == "index" or (key and state.history.worth_planning(key, len(queries))):
            gate = None
            if index_type == "hnsw" and key:
                hit = filter_plan.local_share(index, queries, allowed, filter_plan.GATE_PROBE) > 0
                gate = filter_plan.Gate(hit, hit | state.history.probe_misses(key, len(queries)))
            plan, work = plan_walk(index, index_type, meta, queries, depth, allowed, total,
                                   state, probed=None if gate is None else gate.probed)  # fmt: skip
            walk_ms = costs.walk(work, count)
            walk = (work > 0) & (walk_ms < exact_ms)
            if key:
                state.history.record(key, np.where(walk, exact_ms - walk_ms, 0.0), costs, gate)
        if FORCE == "index":
            if index_type == "hnsw":
                plan = work = np.where(work > 0, work, filter_plan.EF_CAP)
            walk = np.ones(len(queries), bool)
    if FORCE == "exact":
        walk[:] = False
    inner = np.full((len(queries), depth), -np.inf, np.float32)
    found = np.full((len(queries), depth), -1, np.int64)
    lists = np.zeros(len(queries), bool)
    if partition is not None and FORCE != "index":
        costs = state.machine_costs()
        cheaper = coarse_ms(costs, partition, len(allowed), depth) < costs.exact(len(allowed))
        lists = ~walk & (FORCE == "coarse" or cheaper)
    if lists.any():
        assert partition is not None

        def scan(rows: np.ndarray, ids: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
            return exact_search(rows, vectors_of, ids, depth, rows_of)

        inner[lists], found[lists] = coarse.scan(partition.plan(queries[lists], allowed, depth),
                                                 queries[lists], allowed, depth, scan)  # fmt: skip
    plain = ~walk & ~lists
    if plain.any():
        inner[plain], found[plain] = exact_search(queries[plain], vectors_of, allowed, depth,
                                                  rows_of)  # fmt: skip
    if walk.any():
        got = walk_index(index, index_type, queries, depth, allowed, vectors_of, plan, walk,
                         Rule.from_meta(meta).refine)  # fmt: skip
        inner[walk], found[walk] = complete_rows(*got, queries[walk], vectors_of, allowed,
                                                 rows_of)  # fmt: skip
    info.update(exact=int(plain.sum()), index=int(walk.sum()), coarse=int(lists.sum()))
    rule = Rule.from_meta(meta)
    # a rule tuned to a lower target (a gallery built before it was raised) or that stayed
    # under it: the walks' measured recall is what is known
    if walk.any() and rule.tuned_recall is not None and rule.tuned_recall < TARGET_RECALL:
        info["notes"].append(
            f"recall target {TARGET_RECALL:g} not promised: the gallery's filtered walks were "
            f"tuned to recall@10 {rule.tuned_recall:g}"
        )
    state.last = info
    return inner, found


def coarse_ms(costs: Costs, partition: coarse.Partition, allowed: int, depth: int) -> float:
    """A query's cost of reading the lists nearest it: an exact search of the items its rule
    reads (and up to a list more), and its passes over every allowed id."""
    read = partition.reads(depth) + partition.mean_list()
    return float(costs.exact(int(min(read, allowed)))) + partition.selection_ms() * allowed


def narrowest_walk(index_type: str, meta: dict[str, Any], total: int) -> float:
    """The work of the narrowest filtered walk (the unfiltered one's): where the exact search
    costs less than planning and taking it, no walk is planned at all (the plan's own cost
    is saved)."""
    if index_type == "hnsw":
        return float(meta.get("ef_search", 64))
    nlist = max(1, int(meta.get("nlist") or 1))
    return int(meta.get("nprobe", 8)) * total / nlist


def plan_walk(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    queries: np.ndarray,
    depth: int,
    allowed: np.ndarray,
    total: int,
    state: FilterState,
    probed: np.ndarray | None = None,
) -> tuple[Any, np.ndarray]:
    """(the walk's plan, its work per query: HNSW efSearch or IVF list entries; 0: no walk
    promises the target). ``probed``: HNSW's queries whose spread is probed (None: all; the
    others are searched exactly)."""
    if index_type == "hnsw":
        if probed is not None and not probed.any():  # every query exact: nothing to plan
            return None, np.zeros(len(queries), np.int64)
        ef = int(meta.get("ef_search", 64))
        probed = np.ones(len(queries), bool) if probed is None else probed
        local = np.zeros(len(queries))
        local[probed] = filter_plan.local_share(index, queries[probed], allowed,
                                                max(ef, filter_plan.LOCAL_PROBE))  # fmt: skip
        efs = filter_plan.hnsw_ef(ef, local, Rule.from_meta(meta).alpha, depth)
        return efs, efs
    lists_of(index, state)
    assert state.list_of is not None and state.list_sizes is not None
    ivf = faiss.extract_index_ivf(index)
    held = np.bincount(state.list_of[allowed], minlength=ivf.nlist + 1)[1:]
    rotated = rotate(index, index_type, queries)
    scores, order = ivf.quantizer.search(rotated, int(ivf.nlist))
    mean_list = max(1.0, total / ivf.nlist)
    nprobe = int(meta.get("nprobe", 8))
    lists = filter_plan.ivf_lists(order, held, nprobe, mean_list, Rule.from_meta(meta).alpha)
    work = np.array([state.list_sizes[chosen].sum() for chosen in lists], np.int64)
    return (rotated, scores, order, lists), np.maximum(work, 1)


def walk_index(
    index: faiss.Index,
    index_type: str,
    queries: np.ndarray,
    depth: int,
    allowed: np.ndarray,
    vectors_of: VectorsOf,
    plan: Any,
    walk: np.ndarray,
    refine_times: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The walk of the queries ``walk`` marks, as planned; PQ types re-rank ``refine_times``
    x refine_candidates(depth) candidates (the rule's ``refine``)."""
    rerank = index_type in PQ_TYPES
    wanted = min(len(allowed), refine_times * refine_candidates(depth)) if rerank else depth
    selector, bits = id_bitmap(allowed)
    picked = np.flatnonzero(walk)
    inner = np.full((len(picked), wanted), -np.inf, np.float32)
    found = np.full((len(picked), wanted), -1, np.int64)
    if index_type == "hnsw":
        search = getattr(index, "search_numpy", index.search)
        efs = plan[picked]
        for ef in np.unique(efs):
            rows = efs == ef
            # SearchParametersHNSW: in faiss's SWIG module, missing from its stubs
            params = faiss.SearchParametersHNSW(  # type: ignore[attr-defined]
                sel=selector, efSearch=int(max(ef, wanted))
            )
            params.referenced_objects = [selector, bits]
            inner[rows], found[rows] = search(queries[picked[rows]], wanted, params=params)
    else:
        rotated, scores, order, lists = plan
        width = max(len(lists[q]) for q in picked)
        assign = np.full((len(picked), width), -1, np.int64)
        dis = np.zeros((len(picked), width), np.float32)
        for row, q in enumerate(picked):
            chosen = lists[q]
            assign[row, : len(chosen)] = chosen
            position = np.empty(len(order[q]), np.int64)
            position[order[q]] = np.arange(len(order[q]))
            dis[row, : len(chosen)] = scores[q, position[chosen]]
        ivf = faiss.extract_index_ivf(index)
        # faiss's Python wrapper takes fields as keywords and keeps objects alive through
        # referenced_objects, and exposes the C entry point: none of it is in its stubs
        ivf_params = faiss.SearchParametersIVF(sel=selector, nprobe=width)  # type: ignore[call-arg]
        ivf_params.referenced_objects = [selector, bits]  # type: ignore[attr-defined]
        x = np.ascontiguousarray(rotated[picked], np.float32)
        search_preassigned = ivf.search_preassigned_c  # type: ignore[attr-defined]
        search_preassigned(len(x), faiss.swig_ptr(x), wanted, faiss.swig_ptr(assign),
                           faiss.swig_ptr(dis), faiss.swig_ptr(inner),
                           faiss.swig_ptr(found), False, ivf_params)  # fmt: skip
    if rerank:
        return refine(queries[picked], found, vectors_of, depth)
    return inner, found


def lists_of(index: faiss.Index, state: FilterState) -> None:
    """state.list_of (the inverted list of each id) and state.list_sizes, read once."""
    if state.list_of is not None:
        return
    ivf = faiss.extract_index_ivf(index)
    invlists = ivf.invlists
    assert invlists is not None, "an IVF index has inverted lists"
    sizes = np.array([invlists.list_size(n) for n in range(ivf.nlist)], np.int64)
    chunks = [
        faiss.rev_swig_ptr(invlists.get_ids(n), int(sizes[n])).copy() if sizes[n] else None
        for n in range(ivf.nlist)
    ]
    top = max((int(c.max()) for c in chunks if c is not None), default=-1)
    list_of = np.zeros(top + 2, np.int32)  # 0: in no list; list n is stored as n + 1
    for number, ids in enumerate(chunks):
        if ids is not None:
            list_of[ids] = number + 1
    state.list_of, state.list_sizes = list_of, sizes


def rotate(index: faiss.Index, index_type: str, queries: np.ndarray) -> np.ndarray:
    """The queries as the IVF index behind an OPQ rotation sees them (others: as given)."""
    if index_type != "opq":
        return np.ascontiguousarray(queries, np.float32)
    # an OPQ gallery's index: an IndexPreTransform (faiss_index.make_index)
    chain = cast(faiss.IndexPreTransform, faiss.downcast_index(index)).chain
    out = np.ascontiguousarray(queries, np.float32)
    # chain is a SWIG vector (size, at); faiss's stubs call it a list
    for number in range(chain.size()):  # type: ignore[attr-defined]
        transform = chain.at(number)  # type: ignore[attr-defined]
        out = faiss.downcast_VectorTransform(transform).apply(out)
    return np.ascontiguousarray(out, np.float32)


def codes_only_search(
    index: faiss.Index,
    index_type: str,
    meta: dict[str, Any],
    queries: np.ndarray,
    depth: int,
    allowed: np.ndarray,
    total: int,
    vectors_of: VectorsOf,
) -> tuple[np.ndarray, np.ndarray]:
    """A PQ gallery without exact vectors: nprobe widened by total / allowed, the codes'
    order, short rows completed over the decoded codes."""
    selector, bits = id_bitmap(allowed)
    nlist = int(faiss.extract_index_ivf(index).nlist)
    widen = total / max(1, len(allowed))
    nprobe = min(nlist, math.ceil(int(meta.get("nprobe", 8)) * widen))
    # faiss's Python wrapper takes fields as keywords and keeps objects alive through
    # referenced_objects: neither is in its stubs
    params: faiss.SearchParameters
    params = faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)  # type: ignore[call-arg]
    kept: list[Any] = [selector, bits]
    if index_type == "opq":  # the IVF index sits behind the rotation
        kept.append(params)
        params = faiss.SearchParametersPreTransform(index_params=params)  # type: ignore[call-arg]
    params.referenced_objects = kept  # type: ignore[union-attr]
    search = getattr(index, "search_numpy", index.search)
    inner, found = search(queries, depth, params=params)
    return complete_rows(inner, found, queries, vectors_of, allowed)


def id_bitmap(allowed: np.ndarray) -> tuple[faiss.IDSelector, np.ndarray]:
    """An ``IDSelectorBitmap`` admitting the ids ``allowed`` (sorted, >= 0), and its bits
    (to keep alive with it): one bit per id up to the largest, built in microseconds where an
    ``IDSelectorBatch`` hashes every id (milliseconds for tens of thousands)."""
    size = int(allowed[-1]) + 1 if len(allowed) else 1
    bits = np.zeros(size, dtype=bool)
    bits[allowed] = True
    packed = np.packbits(bits, bitorder="little")  # FAISS reads bit i of byte i >> 3
    # its n is the bitmap's size in bytes: ids past them are out, never read past the end
    return faiss.IDSelectorBitmap(len(packed), faiss.swig_ptr(packed)), packed
