"""Choosing a re-ranking on validation classes: a small grid, scored by leave-one-out.

The choice is the spec with the highest MAP@R whose Recall@1 is not below plain search's, on a
gallery of classes that are not the test classes (held-out training classes, or any gallery the
caller names): never tuned on the gallery it is then applied to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nearsight.search.rerank.spec import NONE, RerankSpec, parse_rerank

GRID: tuple[str, ...] = (
    "none",
    *(f"aqe:k={k},alpha={a}" for k in (1, 2, 3, 5) for a in (1, 3)),
    *(f"dba:k={k},alpha={a}" for k in (1, 2, 3, 5) for a in (1, 3)),
    *(f"dba+aqe:k={k},alpha=3" for k in (1, 2, 3, 5)),
    *(
        f"kreciprocal:k1={k1},k2={k2},lambda={lam}"
        for k1, k2, lam in (
            (20, 6, 0.3),
            (20, 10, 0.3),
            (15, 4, 0.3),
            (10, 3, 0.3),
            (5, 2, 0.3),
            (10, 3, 0.6),
        )
    ),
)


@dataclass
class TuningRow:
    spec: RerankSpec
    recall_at_1: float
    map_at_r: float


def choose(rows: Sequence[TuningRow]) -> RerankSpec:
    """The best MAP@R among the specs that keep Recall@1 (plain search's row: ``none``)."""
    base = next(row for row in rows if not row.spec.active)
    keeping = [row for row in rows if row.recall_at_1 >= base.recall_at_1]
    best = max(keeping, key=lambda row: row.map_at_r)
    return best.spec if best.map_at_r > base.map_at_r else NONE


def tune(
    evaluate: Callable[[RerankSpec], dict[str, float | int]],
    grid: Sequence[str] = GRID,
    progress: Callable[[TuningRow], None] | None = None,
) -> tuple[RerankSpec, list[TuningRow]]:
    """Score every spec of ``grid`` with ``evaluate`` (a gallery's leave-one-out metrics) and
    return (the choice, the table)."""
    rows = []
    for text in grid:
        spec = parse_rerank(text)
        metrics = evaluate(spec)
        row = TuningRow(spec, float(metrics["recall@1"]), float(metrics["map@r"]))
        rows.append(row)
        if progress is not None:
            progress(row)
    return choose(rows), rows
