"""Leave-one-out failures as tables (nearsight/search/inspect/failures.py) against a brute-force
oracle, and the two-gallery comparison (compare.py): its counts agree with the per-item
results exactly."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.inspect_data import clustered_vectors, import_vectors, top1_correct

from nearsight.search.inspect.compare import compare_galleries, paired_bootstrap
from nearsight.search.inspect.failures import inspect_failures


@pytest.fixture(scope="module")
def clustered(tmp_path_factory):
    """(vectors, labels, gallery keyed sku-NNNN) of 12 classes, Recall@1 between 0 and 1."""
    vectors, labels = clustered_vectors(5, classes=12, per_class=(6, 14), dim=16, spread=2.2)
    keys = [f"sku-{row:04d}" for row in range(len(labels))]
    gallery = import_vectors(tmp_path_factory.mktemp("clustered"), "g", vectors, labels, keys)
    return vectors, labels, gallery


def oracle(vectors: np.ndarray, labels: np.ndarray):
    inner = vectors.astype(np.float64) @ vectors.T.astype(np.float64)
    np.fill_diagonal(inner, -np.inf)
    top = inner.argmax(axis=1)
    same = labels[:, None] == labels[None, :]
    positive_inner = np.where(same, inner, -np.inf)
    positive = positive_inner.argmax(axis=1)
    to_distance = lambda s: np.sqrt(np.maximum(0.0, 2 - 2 * s))  # noqa: E731
    return (
        top,
        to_distance(inner[np.arange(len(top)), top]),
        positive,
        to_distance(positive_inner[np.arange(len(top)), positive]),
    )


def test_each_failure_matches_the_brute_force_answer(clustered):
    vectors, labels, gallery = clustered
    report = inspect_failures(gallery)
    top, top_distance, positive, positive_distance = oracle(vectors, labels)
    failed = np.flatnonzero(labels[top] != labels)
    assert 0 < len(failed) < len(labels)
    frame = report.failures.set_index("id")
    assert sorted(frame.index) == sorted(failed.tolist())
    for item in failed:
        row = frame.loc[item]
        assert row["key"] == f"sku-{item:04d}"
        assert row["class"] == f"class-{labels[item]}"
        assert row["top1_id"] == top[item] and row["top1_key"] == f"sku-{top[item]:04d}"
        assert row["top1_class"] == f"class-{labels[top[item]]}"
        assert row["positive_id"] == positive[item]
        assert row["top1_distance"] == pytest.approx(top_distance[item], abs=1e-4)
        assert row["positive_distance"] == pytest.approx(positive_distance[item], abs=1e-4)
        assert row["margin"] == pytest.approx(
            positive_distance[item] - top_distance[item], abs=2e-4
        )
        assert row["margin"] > 0
    assert report.failures["margin"].is_monotonic_decreasing  # worst first
    assert report.metrics["recall@1"] == pytest.approx(1 - len(failed) / len(labels))
    # per class: Recall@1 from the same failures, lowest first
    classes = report.classes.set_index("class")
    for label in np.unique(labels):
        members = labels == label
        expected = 1 - np.isin(np.flatnonzero(members), failed).sum() / members.sum()
        assert classes.loc[f"class-{label}", "recall@1"] == pytest.approx(expected)
    assert report.classes["recall@1"].is_monotonic_increasing
    assert report.pairs["failures"].sum() == len(failed)


def test_compare_counts_agree_with_the_per_item_results_exactly(clustered, tmp_path):
    vectors, labels, before = clustered
    rng = np.random.default_rng(1)
    moved = vectors + 0.35 * rng.normal(size=vectors.shape).astype(np.float32) / 4
    moved /= np.linalg.norm(moved, axis=1, keepdims=True)
    # the second gallery holds the same items in another order, under other ids: by key
    order = rng.permutation(len(labels))
    keys = [f"sku-{row:04d}" for row in order]
    after = import_vectors(tmp_path, "after", moved[order], labels[order], keys=keys)

    comparison = compare_galleries(after, before, samples=500)
    assert comparison.matched_by == "key" and comparison.queries == len(labels)
    right_before = top1_correct(vectors, labels)
    right_after = top1_correct(moved, labels)
    assert comparison.recall_baseline == pytest.approx(right_before.mean())
    assert comparison.recall_gallery == pytest.approx(right_after.mean())
    counts = comparison.counts
    assert counts["fixed"] == int((right_after & ~right_before).sum()) > 0
    assert counts["broken"] == int((~right_after & right_before).sum()) > 0
    assert counts["wrong in both"] == int((~right_after & ~right_before).sum())
    assert sum(counts.values()) == comparison.queries
    assert counts["fixed"] - counts["broken"] == round(comparison.delta * comparison.queries)
    assert abs(counts["fixed"] - counts["broken"] - comparison.delta * comparison.queries) < 1e-9
    low, high = comparison.interval
    assert low <= comparison.delta <= high and low < high
    # per item, by key: the verdict follows each gallery's own top-1
    by_key = comparison.items.set_index("key")
    for item in range(len(labels)):
        verdict = by_key.loc[f"sku-{item:04d}", "verdict"]
        expected = {(True, False): "fixed", (False, True): "broken",
                    (True, True): "right in both", (False, False): "wrong in both"}  # fmt: skip
        assert verdict == expected[(bool(right_after[item]), bool(right_before[item]))]


def test_a_gallery_compared_with_itself_changes_nothing(clustered):
    _, labels, gallery = clustered
    comparison = compare_galleries(gallery, gallery, samples=200)
    assert comparison.counts["fixed"] == comparison.counts["broken"] == 0
    assert comparison.delta == 0 and comparison.interval == (0.0, 0.0)


def test_the_paired_bootstrap_interval_covers_a_known_difference():
    rng = np.random.default_rng(0)
    right_a = rng.random(2000) < 0.7
    right_b = np.where(rng.random(2000) < 0.9, right_a, ~right_a)  # 10% of queries change
    low, high = paired_bootstrap(right_a, right_b, 1000, seed=0)
    delta = right_a.mean() - right_b.mean()
    assert low < delta < high
    # paired: the width follows the changed queries (10%), not two independent recalls
    assert high - low < 0.04
