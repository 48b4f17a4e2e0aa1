"""Which leave-one-out queries a re-ranking fixes and which it breaks (the page's Failures tab)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nearsight.search.rerank.search import reranked_search
from nearsight.search.rerank.spec import RerankSpec

if TYPE_CHECKING:
    from nearsight.index.gallery.core import Gallery

CHUNK = 256  # queries per search call
# k-reciprocal re-ranks cost ~depth^3 per query: past this many labelled items the page says so
MAX_COMPARED_ITEMS = 20_000


@dataclass
class Change:
    """A labelled item whose leave-one-out top-1 changed class correctness under re-ranking."""

    id: int
    label: int
    before_id: int
    before_label: int
    after_id: int
    after_label: int

    @property
    def fixed(self) -> bool:
        return self.after_label == self.label


def rerank_changes(gallery: Gallery, spec: RerankSpec) -> list[Change]:
    """Labelled items whose top-1 (others only) is right with ``spec`` and wrong without, or
    the reverse; fixed ones first."""
    labelled = gallery.labels >= 0
    ids = gallery.ids[labelled]
    before, after = np.full(len(ids), -1), np.full(len(ids), -1)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        vectors = gallery.vectors_of(chunk)
        _, plain = gallery.search(vectors, 1, exclude=chunk)
        before[start : start + len(chunk)] = plain[:, 0]
        _, reranked = reranked_search(gallery, vectors, 1, spec, exclude=chunk)
        after[start : start + len(chunk)] = reranked[:, 0]
    labels = gallery.labels[labelled]
    before_labels, after_labels = _labels_of(gallery, before), _labels_of(gallery, after)
    changed = np.flatnonzero((before_labels == labels) != (after_labels == labels))
    changes = [
        Change(*(int(x) for x in row))
        for row in zip(
            ids[changed], labels[changed], before[changed], before_labels[changed],
            after[changed], after_labels[changed], strict=True,
        )
    ]  # fmt: skip
    return sorted(changes, key=lambda change: not change.fixed)


def _labels_of(gallery: Gallery, ids: np.ndarray) -> np.ndarray:
    """Labels of ``ids`` (-1 for none found, or unlabelled)."""
    rows = np.clip(np.searchsorted(gallery.ids, ids), 0, len(gallery.ids) - 1)
    found = (ids >= 0) & (gallery.ids[rows] == ids)
    return np.where(found, gallery.labels[rows], -1)
