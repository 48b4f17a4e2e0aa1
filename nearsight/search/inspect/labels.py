"""Suspected wrong labels: items whose neighbourhood disagrees with their label.

Method: confident learning (Northcutt, Jiang and Chuang, "Confident Learning: Estimating
Uncertainty in Dataset Labels", JAIR 2021) through cleanlab, on out-of-sample class
probabilities from the embedding. Each labelled item's probabilities come from its ``k``
nearest other labelled items (leave-one-out, exact): a class's share of the votes, divided by
the largest share that class could hold (a class of 5 items fills at most 4 of 50 places), then
normalised. cleanlab's self-confidence (the probability of the given label) ranks the items,
and its ``find_label_issues`` (prune by noise rate) flags those it estimates are mislabelled.
The suggested label is the most probable class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.search.inspect.items import GalleryLike, exact_neighbours, gallery_items, opened

if TYPE_CHECKING:
    import pandas as pd

NEIGHBOURS = 50  # votes per item (fewer in a gallery of fewer labelled items)
SMOOTHING = 1e-3  # added to every class's probability: no exact zeros for cleanlab's logs


@dataclass
class LabelScores:
    """Per labelled item (rows of the labelled subset): the given class index, the suggested
    one, the label quality (low: suspicious) and cleanlab's issue flag."""

    given: np.ndarray  # int [M] class index (into ``classes``)
    suggested: np.ndarray  # int [M]
    quality: np.ndarray  # float [M], in [0, 1]
    given_probability: np.ndarray
    suggested_probability: np.ndarray
    issue: np.ndarray  # bool [M]
    classes: np.ndarray  # the gallery labels, one per class index


def knn_class_probabilities(
    vectors: np.ndarray, labels: np.ndarray, k: int = NEIGHBOURS
) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities [M, C], classes [C]) of the labelled ``vectors`` (unit rows) from their
    ``k`` nearest others' labels, each class's votes divided by the most it could get
    (module docstring)."""
    classes, given = np.unique(labels, return_inverse=True)
    count = len(vectors)
    k = max(1, min(k, count - 1))
    _, found = exact_neighbours(vectors, vectors, k, leave_one_out=True)
    votes = np.zeros((count, len(classes)), dtype=np.float64)
    rows = np.repeat(np.arange(count), k)
    valid = found.reshape(-1) >= 0
    np.add.at(votes, (rows[valid], given[found.reshape(-1)[valid]]), 1.0)
    sizes = np.bincount(given, minlength=len(classes))
    most = np.minimum(k, np.maximum(sizes - 1, 1)).astype(np.float64)  # at most this many votes
    shares = votes / most[None, :] + SMOOTHING
    return shares / shares.sum(axis=1, keepdims=True), classes


def score_labels(vectors: np.ndarray, labels: np.ndarray, k: int = NEIGHBOURS) -> LabelScores:
    """Confident learning on kNN class probabilities (module docstring) for labelled vectors."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    if len(vectors) < 3 or len(np.unique(labels)) < 2:
        raise NearsightError(
            "suspected labels need at least 3 labelled items of at least 2 classes"
        )
    probabilities, classes = knn_class_probabilities(vectors, labels, k)
    given = np.searchsorted(classes, labels)
    quality = get_label_quality_scores(given, probabilities, method="self_confidence")
    issue = find_label_issues(given, probabilities, filter_by="prune_by_noise_rate")
    suggested = probabilities.argmax(axis=1)
    rows = np.arange(len(given))
    return LabelScores(
        given=given,
        suggested=suggested,
        quality=np.asarray(quality, dtype=np.float64),
        given_probability=probabilities[rows, given],
        suggested_probability=probabilities[rows, suggested],
        issue=np.asarray(issue, dtype=bool),
        classes=classes,
    )


def suspected_labels(
    gallery: GalleryLike, top: int | None = None, k: int = NEIGHBOURS
) -> pd.DataFrame:
    """A gallery's labelled items ranked by how strongly their neighbourhood disagrees with
    their label (most suspicious first; items whose suggested label is their own are left
    out), each with the label its neighbours suggest. ``top``: at most this many rows."""
    import pandas as pd

    with opened(gallery) as open_gallery:
        items = gallery_items(open_gallery)
        labelled = np.flatnonzero(items.labels >= 0)
        vectors = np.asarray(open_gallery.vector_rows(items.ids[labelled]), dtype=np.float32)
    scores = score_labels(vectors, items.labels[labelled], k)
    order = np.argsort(scores.quality, kind="stable")
    order = order[scores.suggested[order] != scores.given[order]]
    if top is not None:
        order = order[:top]
    rows = labelled[order]
    given_labels = scores.classes[scores.given[order]]
    suggested_labels = scores.classes[scores.suggested[order]]
    frame = pd.DataFrame(
        {
            "rank": np.arange(1, len(order) + 1),
            **items.describe(rows),
            "class": [items.class_name(int(label)) for label in given_labels],
            "suggested class": [items.class_name(int(label)) for label in suggested_labels],
            "label quality": np.round(scores.quality[order], 4),
            "given probability": np.round(scores.given_probability[order], 4),
            "suggested probability": np.round(scores.suggested_probability[order], 4),
            "issue": scores.issue[order],
        }
    )
    return frame
