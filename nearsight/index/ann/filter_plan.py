"""How a filtered search is made: exactly over the allowed items, or by walking the index, each
query by whichever costs less on this machine while it meets the recall target.

Two stored, measured parts (gallery meta ``filter_route``, written at build time by
:func:`nearsight.index.ann.filter_tuning.tune_filters`):

- **the widening rule** (``alpha``): how much wider than the unfiltered efSearch / nprobe a
  filtered walk must be for recall@10 >= TARGET_RECALL, as a function of the filter's share *and*
  spread near the query (below), tuned on held-out queries with random and clustered filters;
- **the costs** (``costs``): milliseconds of one query's exact search as ``a + b x allowed
  items``, of a walk as ``a + b x work`` (HNSW: efSearch; IVF: list entries scanned), and of
  planning a walk (HNSW: the unfiltered probe below; IVF: in the walk's own fixed cost, as its
  quantizer ordering is timed with it), timed on the machine that built the gallery. A gallery
  opened on another machine (or one written before this) times them again, once, in memory
  (:func:`calibrate`). A walk is planned only where the plan and the narrowest walk together
  cost less than the exact search: where they cannot, the plan's own time would be lost.

The spread of a filter near a query (``local share``):

- HNSW: the share of allowed items among the query's ``LOCAL_PROBE`` nearest (one unfiltered
  walk). FAISS's filtered HNSW walk keeps every node it visits as a candidate and only the
  allowed ones as results, so it sees ~``local share x efSearch`` allowed items: efSearch is
  widened to ``alpha x efSearch / local share``. None allowed among them (the filter's items lie
  away from the query: a category that does not hold the query's cluster) or a widening past
  EF_CAP: the walk cannot promise the target, the search is exact.

  A narrower walk first (the gate: the ``GATE_PROBE`` nearest, a sixth of the probe's cost)
  asks whether any allowed item is near at all. A query whose gate finds none (a miss) is
  probed only while most of the filter's probed misses repay their probe (:class:`PlanHistory`):
  for a category away from most queries nearly every miss goes exact after its probe, and a
  probe that most misses pay for nothing raises the typical query's latency, even where the
  few misses that then walk lower the mean. A miss left unprobed is searched exactly, so the
  gate moves a query's cost, never its recall.
- IVF types: the allowed items per inverted list (one bincount of the allowed ids' lists).
  The lists holding allowed items are probed nearest first until they hold ``alpha x nprobe x
  mean list size`` allowed items (a random filter of share s: about nprobe / s lists; a filter
  whose items cluster: few, well-filled lists), through ``search_preassigned`` so that lists
  without allowed items cost nothing.
"""

from __future__ import annotations

import math
import platform
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import faiss
import numpy as np

from nearsight.index.ann.tuning import TUNING_K

# the recall@10 a filtered search promises where it walks an index (an exact search gives the
# true top-k): the widening rule is tuned to it at build (filter_tuning.tune_filters), whatever
# the unfiltered search's target, and an answer from a gallery whose rule stayed under it says
# so (filtered.search_allowed)
TARGET_RECALL = 0.99
# fewer items: every filtered search is exact (it costs next to nothing, and the answer is the
# same in every process, whatever each one's timings)
MIN_PLAN_ITEMS = 1000
EF_CAP = 4096  # the widest filtered HNSW walk: past it an exact search is cheaper anywhere
LOCAL_PROBE = 128  # HNSW: nearest items whose allowed share estimates the spread
GATE_PROBE = 16  # HNSW: nearest items first looked at for any allowed one (the gate)
DEFAULT_ALPHA = 2.0  # a gallery built before the rule was tuned
ALPHAS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)  # the tuning's grid
# PQ types: how many times tuning.refine_candidates a filtered walk re-ranks by the exact
# vectors, tuned beside alpha (the codes' order among a walk's many allowed items can leave a
# true neighbour past the unfiltered search's candidates; re-ranking more costs microseconds
# where widening the walk costs milliseconds, so each alpha tries them all first)
REFINES = (1, 4)
MIN_PLANNED = 16  # queries of a filter planned before its history may skip the plan
EXPLORE_EVERY = 8  # a filter whose plan is skipped plans again every this many searches
HISTORY_FILTERS = 256  # filters an open gallery remembers (least recently used dropped)


@dataclass
class Costs:
    """One query's cost in milliseconds: exact = a + b x allowed, walk = a + b x work + c x
    allowed (c: the walk's selector bitmap and, for IVF, the allowed items per list),
    ``plan``: planning one query's walk before any of it (HNSW's probe), and ``gate``: HNSW's
    gate before the probe (module docstring)."""

    exact_fixed: float
    exact_per_item: float
    walk_fixed: float
    walk_per_unit: float
    host: str = field(default_factory=platform.node)
    walk_per_allowed: float = 0.0
    plan: float = 0.0
    gate: float = 0.0

    # (plain floats for one count: every filtered search asks, and numpy's scalar arithmetic
    # costs microseconds where the search itself may take a tenth of a millisecond)
    def exact(self, allowed: int | np.ndarray) -> float | np.ndarray:
        if isinstance(allowed, np.ndarray):
            return self.exact_fixed + self.exact_per_item * allowed.astype(np.float64)
        return self.exact_fixed + self.exact_per_item * float(allowed)

    def walk(self, work: float | np.ndarray, allowed: int = 0) -> float | np.ndarray:
        fixed = self.walk_fixed + self.walk_per_allowed * allowed
        if isinstance(work, np.ndarray):
            return fixed + self.walk_per_unit * work.astype(np.float64)
        return fixed + self.walk_per_unit * float(work)

    def as_meta(self) -> dict[str, Any]:
        return {
            "exact_fixed_ms": round(self.exact_fixed, 5),
            "exact_ms_per_item": self.exact_per_item,
            "walk_fixed_ms": round(self.walk_fixed, 5),
            "walk_ms_per_unit": self.walk_per_unit,
            "walk_ms_per_allowed": self.walk_per_allowed,
            "plan_ms": round(self.plan, 5),
            "gate_ms": round(self.gate, 5),
            "host": self.host,
        }

    @classmethod
    def from_meta(cls, record: dict[str, Any] | None) -> Costs | None:
        """The stored costs, if measured on this machine (else None: measure them; also for
        costs stored before the plan's own, and its gate's, were timed)."""
        if not record or record.get("host") != platform.node():
            return None
        if "plan_ms" not in record or "gate_ms" not in record:
            return None
        return cls(
            float(record["exact_fixed_ms"]),
            float(record["exact_ms_per_item"]),
            float(record["walk_fixed_ms"]),
            float(record["walk_ms_per_unit"]),
            str(record["host"]),
            float(record.get("walk_ms_per_allowed", 0.0)),
            float(record["plan_ms"]),
            float(record["gate_ms"]),
        )


@dataclass
class Rule:
    """The stored widening rule (``alpha``; PQ types: ``refine``, REFINES) and the recall it
    gave at tuning time."""

    alpha: float = DEFAULT_ALPHA
    tuned_recall: float | None = None
    refine: int = 1

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Rule:
        record = meta.get("filter_route") or {}
        return cls(float(record.get("alpha", DEFAULT_ALPHA)), record.get("tuned_recall"),
                   int(record.get("refine", 1)))  # fmt: skip


def hnsw_ef(ef: int, local_share: np.ndarray, alpha: float, depth: int) -> np.ndarray:
    """Per query, the widened efSearch of a filtered walk, or 0 where no walk within EF_CAP
    promises the target (no allowed item near the query).

    The width is the one the rule was tuned for, ``alpha x efSearch / local share`` (its
    recall@TUNING_K, the promise), whatever ``depth`` the walk returns (at least that many
    wide): the search route asks HNSW for a whole window of ranks (route.candidate_window,
    128) so that pages agree, and widening by the window (alpha x 128 / share, 4x the tuned
    efSearch of 32) made a 20% filter's walk cost 15 ms of CPU where its first 10 ranks
    need 4. FAISS's walk explores by efSearch alone, so its first ranks are those of the
    narrower walk; ranks the walk leaves short are filled exactly (filtered.complete_rows)."""
    share = np.asarray(local_share, np.float64)
    wanted = np.ceil(alpha * max(ef, TUNING_K) / np.maximum(share, 1e-12))
    wanted = np.maximum(wanted, max(ef, depth))
    wanted[(share <= 0) | (wanted > EF_CAP)] = 0
    return wanted.astype(np.int64)


def ivf_lists(
    order: np.ndarray, allowed_per_list: np.ndarray, nprobe: int, mean_list: float, alpha: float
) -> list[np.ndarray]:
    """Per query, the lists to probe: those holding allowed items, in the query's order
    (``order`` [Q, nlist], nearest first), until they hold ``alpha x nprobe x mean_list``
    allowed items (and at least nprobe lists, when there are as many)."""
    target = alpha * nprobe * mean_list
    out = []
    for row in order:
        held = allowed_per_list[row]
        lists = row[held > 0]
        covered = np.cumsum(held[held > 0])
        count = int(np.searchsorted(covered, target)) + 1
        out.append(lists[: max(count, min(nprobe, len(lists)))])
    return out


def median_ms(run: Callable[[], object], repeats: int) -> float:
    """The median CPU time of ``run`` on this thread (one query's search runs on the calling
    thread whatever FAISS's thread count): the work, not the wait for a loaded machine's
    cores, which inflated a build's costs (a walk's fixed 16 ms under load 9) until every
    filtered search went exact."""
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        run()
        times.append(time.thread_time() - start)
    return float(np.median(times) * 1000)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of ms = a + b x size through the two measured (size, ms), both >= 0; where
    noise (a loaded machine) makes the wider point no slower, the cost is taken as
    proportional to the size (through the wider point), never free."""
    (x1, y1), (x2, y2) = points
    slope = (y2 - y1) / max(1e-9, x2 - x1)
    if slope <= 0:
        return 0.0, max(y2, 1e-6) / max(x2, 1.0)
    return max(0.0, y1 - slope * x1), slope


@dataclass
class Gate:
    """HNSW's gate over a search's queries: ``hit``, an allowed item among the GATE_PROBE
    nearest; ``probed``, the queries whose spread is probed (the hits, and the misses while
    misses pay for their probes)."""

    hit: np.ndarray
    probed: np.ndarray


@dataclass
class _FilterRecord:
    planned: int = 0  # queries planned
    repaid: int = 0  # of them, those whose walk saved more than their plan cost (gate, probe)
    skips: int = 0
    misses: int = 0  # queries whose gate found no allowed item, probed all the same
    misses_repaid: int = 0  # of them, those whose walk saved more than their probe cost
    miss_skips: int = 0

    def add(self, planned: int, repaid: int, misses: int, misses_repaid: int) -> None:
        self.planned += planned
        self.repaid += repaid
        self.misses += misses
        self.misses_repaid += misses_repaid


class FilterKey(NamedTuple):
    """A filter as the history knows it: ``own``, a fingerprint of its allowed ids, and
    ``family``, its share of the gallery by powers of 2 (None: no family)."""

    own: bytes
    family: int | None


class PlanHistory:
    """Per filter (its allowed ids, by a fingerprint): how many of its planned queries
    repaid their plan, their walk saving more than the plan cost them (the costs' estimate).

    Where most of a filter's planned queries go exact anyway (a category away from most
    queries: HNSW's probe finds no allowed item near them), most of its searches would pay a
    plan for nothing, and its typical search would be slower than the exact search alone,
    even where the few walks lower the mean. So a filter is planned while more than half of
    its planned queries repaid their plan (the median query, not the mean, is what a plan must
    not slow down); once MIN_PLANNED of its queries were planned, a filter that fails this
    goes exact without a plan, planning again every EXPLORE_EVERY-th search to follow its
    queries. The same rule, on the queries whose gate found no allowed item near them, decides
    whether such misses are probed (:func:`probe_misses`).

    A filter whose own queries are too few to judge it, searched a few queries at a time (a
    shop whose every search combines its own filters sees each one once), is judged by its
    family: every filter of about its share of the gallery (within a factor of 2), whose
    record sums its members' (and explores on its own count). A search of MIN_PLANNED queries
    or more judges its new filter itself, by planning it. Only the choice between two ways
    that both meet the recall target depends on any of this, never an answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._filters: OrderedDict[bytes, _FilterRecord] = OrderedDict()
        self._families: dict[int, _FilterRecord] = {}  # a few dozen shares at most

    @staticmethod
    def key(allowed: np.ndarray, total: int | None = None) -> FilterKey:
        """The sorted allowed ids' fingerprint (their count and every 64th of them) and, given
        the gallery's ``total`` items, their family."""
        sample = allowed[:: max(1, len(allowed) // 64)]
        own = len(allowed).to_bytes(8, "little") + sample.tobytes() + allowed[-1:].tobytes()
        family = None
        if total and len(allowed):
            family = math.floor(math.log2(len(allowed) / total))
        return FilterKey(own, family)

    def _judge(
        self, key: FilterKey, queries: int, enough: Callable[[_FilterRecord], bool]
    ) -> _FilterRecord | None:
        """The record that judges a search of ``queries`` queries of filter ``key``: its own
        once ``enough``; else none where the search alone holds enough queries to judge it
        (plan, to learn); else its family's once that is ``enough``."""
        own = self._filters.get(key.own)
        if own is not None and enough(own):
            return own
        if queries >= MIN_PLANNED:
            return None
        family = self._families.get(key.family) if key.family is not None else None
        return family if family is not None and enough(family) else None

    def worth_planning(self, key: FilterKey, queries: int = 1) -> bool:
        """Whether to plan the walks of this search (of ``queries`` queries) of filter ``key``."""
        with self._lock:
            judge = self._judge(key, queries, lambda record: record.planned >= MIN_PLANNED)
            if judge is None or 2 * judge.repaid > judge.planned:
                return True
            judge.skips += 1
            return judge.skips % EXPLORE_EVERY == 0

    def probe_misses(self, key: FilterKey, queries: int = 1) -> bool:
        """Whether this search (of ``queries`` queries) probes its queries whose gate found no
        allowed item near."""
        with self._lock:
            judge = self._judge(key, queries, lambda record: record.misses >= MIN_PLANNED)
            if judge is None or 2 * judge.misses_repaid > judge.misses:
                return True
            judge.miss_skips += 1
            return judge.miss_skips % EXPLORE_EVERY == 0

    def record(self, key: FilterKey, saving: np.ndarray, costs: Costs, gate: Gate | None) -> None:
        """One planned search of filter ``key``: per query, the ms its walk saved (0: exact),
        and the gate, if any (each query paid the gate, and the probe where it was probed)."""
        spent = np.full(len(saving), costs.plan)
        misses = np.zeros(len(saving), bool)
        if gate is not None:
            spent = costs.gate + np.where(gate.probed, costs.plan, 0.0)
            misses = gate.probed & ~gate.hit
        counts = (len(saving), int((saving > spent).sum()), int(misses.sum()),
                  int((saving[misses] > costs.plan).sum()))  # fmt: skip
        with self._lock:
            self._filters.setdefault(key.own, _FilterRecord()).add(*counts)
            self._filters.move_to_end(key.own)
            while len(self._filters) > HISTORY_FILTERS:
                self._filters.popitem(last=False)
            if key.family is not None:
                self._families.setdefault(key.family, _FilterRecord()).add(*counts)


def local_share(
    index: faiss.Index, queries: np.ndarray, allowed: np.ndarray, probe: int
) -> np.ndarray:
    """Per query, the share of allowed items among its ``probe`` nearest (an unfiltered
    HNSW walk)."""
    search = getattr(index, "search_numpy", index.search)
    probe = min(probe, int(index.ntotal))
    # SearchParametersHNSW: in faiss's SWIG module, missing from its stubs
    hnsw_params = faiss.SearchParametersHNSW(efSearch=probe)  # type: ignore[attr-defined]
    _, near = search(queries, probe, params=hnsw_params)
    # a binary search of the sorted allowed ids, not a bitmap as long as the largest id (ids
    # of an imported catalog run into the millions: each plan allocated megabytes)
    at = np.minimum(np.searchsorted(allowed, near), len(allowed) - 1)
    return ((allowed[at] == near) & (near >= 0)).mean(axis=1)
