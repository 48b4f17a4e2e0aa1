"""The papers' leave-one-out metrics with each query's neighbours re-ranked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nearsight.data.metrics.retrieval import evaluate
from nearsight.search.rerank.pipeline import rerank
from nearsight.search.rerank.sources import MatrixSource
from nearsight.search.rerank.spec import RerankSpec


def evaluate_reranked(
    vectors: np.ndarray,
    labels: np.ndarray,
    ks: Sequence[int],
    spec: RerankSpec,
    model_sha256: str | None = None,
    side: np.ndarray | None = None,
    **options: Any,
) -> dict[str, float | int]:
    """:func:`nearsight.data.metrics.retrieval.evaluate` of ``vectors`` with ``spec`` applied to every
    query's nearest other rows; the query's own row is excluded from its candidates (by the
    evaluation) and from every candidate's DBA neighbours (here). ``model_sha256``: the model
    that embedded ``vectors`` (a pairwise re-ranker trained for another is refused; None: not
    recorded, not checked). Each query's first ``spec.depth`` candidates are re-ranked, as in a
    search; deeper ranks keep the base order. ``side``: the rows' stage features [N, F], for a
    pairwise re-ranker that takes them (nearsight.search.rerank.stage_features).
    ``options``: evaluate's."""
    if not spec.active:
        return evaluate(vectors, labels, ks, **options)
    source = MatrixSource(vectors, model_sha256, side)

    def reorder(query_rows: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
        # as a served search does: the first depth candidates re-ranked, the rest (which
        # MAP@R's R may reach) after them in the base order
        head = neighbours[:, : spec.depth]
        query_side = source.side_of(query_rows)
        found, _ = rerank(spec, source, source.vectors_of(query_rows), head, query_rows, query_side)
        return np.concatenate([found, neighbours[:, spec.depth :]], axis=1)

    return evaluate(vectors, labels, ks, reorder=reorder, reorder_depth=spec.depth, **options)
