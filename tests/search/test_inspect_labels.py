"""Suspected wrong labels (nearsight/search/inspect/labels.py): labels flipped at random on 5%
of the items are found near the top of the ranking, at least as precisely as a plain
k-nearest-neighbour vote over the same embeddings."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.inspect_data import clustered_vectors, flip_labels, import_vectors, top1_correct

from nearsight.search.inspect.items import exact_neighbours
from nearsight.search.inspect.labels import NEIGHBOURS, score_labels, suspected_labels

pytest.importorskip("cleanlab")


def precision_at(order: np.ndarray, flipped: np.ndarray) -> float:
    """Share of the first len(flipped) positions of ``order`` that were flipped."""
    return float(np.isin(order[: len(flipped)], flipped).mean())


def plain_vote_order(vectors: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Items by the share of their k nearest others that share their label, lowest first."""
    _, found = exact_neighbours(vectors, vectors, k, leave_one_out=True)
    agreement = (labels[found] == labels[:, None]).mean(axis=1)
    return np.argsort(agreement, kind="stable")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flipped_labels_rank_at_least_as_high_as_by_a_plain_vote(seed):
    vectors, labels = clustered_vectors(seed)
    recall = top1_correct(vectors, labels).mean()
    assert 0.6 < recall < 0.8  # a model of the kind (Recall@1 about 0.72)
    noisy, flipped = flip_labels(labels, 0.05, seed=100 + seed)
    assert len(flipped) >= 40

    scores = score_labels(vectors, noisy)
    ours = precision_at(np.argsort(scores.quality, kind="stable"), flipped)
    votes = {
        k: precision_at(plain_vote_order(vectors, noisy, k), flipped) for k in (10, NEIGHBOURS)
    }
    assert ours >= max(votes.values()), (ours, votes)
    assert ours >= 0.6, ours
    # the suggested label of a flipped item found is mostly its true one
    found = np.argsort(scores.quality, kind="stable")[: len(flipped)]
    found = found[np.isin(found, flipped)]
    suggested = scores.classes[scores.suggested[found]]
    assert (suggested == labels[found]).mean() >= 0.65


def test_a_gallery_s_suspects_carry_keys_and_the_suggested_class(tmp_path):
    vectors, labels = clustered_vectors(3, classes=12, per_class=(15, 25), spread=1.2)
    noisy, flipped = flip_labels(labels, 0.05, seed=7)
    keys = [f"sku-{row:04d}" for row in range(len(labels))]
    gallery = import_vectors(tmp_path, "noisy", vectors, noisy, keys=keys)

    frame = suspected_labels(gallery, top=len(flipped))
    assert list(frame["rank"]) == list(range(1, len(frame) + 1))
    assert frame["label quality"].is_monotonic_increasing
    hits = frame[frame["id"].isin(flipped)]
    assert len(hits) >= 0.8 * len(flipped)  # a well-separated gallery: nearly all found
    right = 0
    for row in hits.to_dict("records"):
        assert row["key"] == keys[row["id"]]
        assert row["class"] == f"class-{noisy[row['id']]}"  # the given (flipped) label
        right += row["suggested class"] == f"class-{labels[row['id']]}"  # the true one
    assert right >= 0.9 * len(hits), (right, len(hits))
    assert (frame["class"] != frame["suggested class"]).all()
