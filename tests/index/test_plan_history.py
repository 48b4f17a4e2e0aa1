"""The plan history on its own (nearsight.index.ann.filter_plan.PlanHistory): which filters
are planned, and which gate misses probed, from what their planned queries saved."""

from __future__ import annotations

import numpy as np

from nearsight.index.ann.filter_plan import (
    EXPLORE_EVERY,
    MIN_PLANNED,
    Costs,
    Gate,
    PlanHistory,
)


def test_the_plan_history_skips_a_filter_only_once_it_knows_it():
    """A filter is planned until MIN_PLANNED of its queries were, then while more than half
    of them repaid their plan (saved more than it cost), else every EXPLORE_EVERY-th search:
    a third of the queries saving 3 ms each is not enough, though it pays by the mean."""
    history, costs = PlanHistory(), Costs(1.0, 0.0, 0.5, 0.0, plan=0.1)
    lean, rich = PlanHistory.key(np.arange(0, 900, 3)), PlanHistory.key(np.arange(1, 900, 3))
    assert lean != rich and history.worth_planning(lean)
    history.record(lean, np.zeros(MIN_PLANNED - 1), costs, None)
    assert history.worth_planning(lean)  # too few queries seen to judge
    third = np.where(np.arange(3 * MIN_PLANNED) % 3 == 0, 3.0, 0.0)
    history.record(lean, third, costs, None)
    asked = [history.worth_planning(lean) for _ in range(2 * EXPLORE_EVERY)]
    assert asked == ([False] * (EXPLORE_EVERY - 1) + [True]) * 2
    history.record(rich, np.full(MIN_PLANNED, 0.2), costs, None)  # 0.2 ms saved a query > 0.1
    assert all(history.worth_planning(rich) for _ in range(2 * EXPLORE_EVERY))


def test_the_plan_history_probes_gate_misses_only_while_most_repay_it():
    """The gate's misses (no allowed item among the GATE_PROBE nearest) are probed until
    MIN_PLANNED of them show what their probes save; then only while more than half of them
    saved more than their probe cost (the median miss: where a few misses save much, the
    mean would pay, but most searches of the filter would carry a probe for nothing), and on
    every EXPLORE_EVERY-th search."""
    history, costs = PlanHistory(), Costs(1.0, 0.0, 0.5, 0.0, plan=0.2, gate=0.05)
    away, near = PlanHistory.key(np.arange(0, 900, 3)), PlanHistory.key(np.arange(1, 900, 3))
    rare = PlanHistory.key(np.arange(2, 900, 3))
    hit = np.arange(2 * MIN_PLANNED) % 2 == 0  # half the queries' gates find allowed items
    everyone = np.ones(len(hit), bool)
    assert history.probe_misses(away)
    # away: only the hits walk (0.6 ms saved each); near: the misses too; rare: a quarter of
    # the misses walk and save 3 ms each (0.75 ms a miss on average, over the 0.2 ms probe)
    history.record(away, np.where(hit, 0.6, 0.0), costs, Gate(hit, everyone))
    history.record(near, np.full(len(hit), 0.6), costs, Gate(hit, everyone))
    quarter = np.arange(len(hit)) % 8 == 1
    history.record(rare, np.where(hit, 0.6, np.where(quarter, 3.0, 0.0)), costs,
                   Gate(hit, everyone))  # fmt: skip
    for skipped in (away, rare):
        asked = [history.probe_misses(skipped) for _ in range(2 * EXPLORE_EVERY)]
        assert asked == ([False] * (EXPLORE_EVERY - 1) + [True]) * 2
    assert all(history.probe_misses(near) for _ in range(2 * EXPLORE_EVERY))
    # near: every query repaid its gate and probe; away: half did, not more than half
    assert history.worth_planning(near) and not history.worth_planning(away)


def test_a_filter_seen_too_few_times_is_judged_by_its_family():
    """A shop whose every search combines its own filters sees each one once: such a filter,
    searched a query at a time, is judged by the filters of about its share of the gallery
    (within a factor of 2) until its own queries are enough to judge it; a search of
    MIN_PLANNED queries judges it by itself."""
    history, costs, total = PlanHistory(), Costs(1.0, 0.0, 0.5, 0.0, plan=0.1), 10_000
    ids = np.arange(total)
    for n in range(8):  # 8 filters of 10% each, 3 queries planned each, one of them repaid
        history.record(PlanHistory.key(ids[n : 1000 + 2 * n], total), np.array([3.0, 0, 0]),
                       costs, None)  # fmt: skip
    fresh = PlanHistory.key(ids[500:1600], total)  # 11%: the same family, never seen
    asked = [history.worth_planning(fresh) for _ in range(2 * EXPLORE_EVERY)]
    assert asked == ([False] * (EXPLORE_EVERY - 1) + [True]) * 2
    # a search of MIN_PLANNED queries judges its new filter itself: it is planned
    assert history.worth_planning(PlanHistory.key(ids[700:1800], total), MIN_PLANNED)
    assert history.worth_planning(PlanHistory.key(ids[:5000], total))  # 50%: no record yet
    assert PlanHistory.key(ids[:1000]).family is None  # no total given: no family
    own = PlanHistory.key(ids[2000:3050], total)  # its own queries repay: its own judgement
    history.record(own, np.full(MIN_PLANNED, 3.0), costs, None)
    assert all(history.worth_planning(own) for _ in range(2 * EXPLORE_EVERY))
    # gate misses the same way: the family's misses did not repay their probes
    hit = np.zeros(2 * MIN_PLANNED, bool)
    history.record(PlanHistory.key(ids[100:1200], total), np.zeros(len(hit)), costs,
                   Gate(hit, ~hit))  # fmt: skip
    assert not history.probe_misses(PlanHistory.key(ids[300:1400], total))
