"""Retrieval metrics (nearsight/data/metrics/retrieval.py): hand-computed toy geometry, self-exclusion with
duplicate vectors, chunking, a brute-force reference, and pytorch-metric-learning's numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import normalized_mutual_info_score

from nearsight.core.errors import NearsightError
from nearsight.data.metrics import nmi as nmi_module
from nearsight.data.metrics import retrieval as metrics
from nearsight.data.metrics.retrieval import (
    CUB_KS,
    SOP_KS,
    default_ks,
    evaluate,
    map_at_r,
    nmi,
    recall_at_k,
)


def on_circle(degrees: list[float]) -> np.ndarray:
    """Unit vectors at these angles: inner-product order = angular-distance order."""
    radians = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


# Four points at 0, 10, 30, 70 degrees with labels 0, 0, 1, 0. Neighbours by angle:
#   A(0):  B(10) C(30) D(70)     first same-class item: B, rank 1
#   B(10): A(10) C(20) D(60)     A, rank 1
#   C(30): B(20) A(30) D(40)     class 1 has no other item: never
#   D(70): C(40) B(60) A(70)     B, rank 2
# Recall@1 = 2/4, Recall@2 = Recall@3 = 3/4 (k = 4 > N - 1 = 3 uses all 3 others).
# MAP@R: class 0 has R = 2 for A, B, D; C has R = 0 and is excluded.
#   A: rel = [1, 0] -> (1/2)(1) = 0.5;  B: same, 0.5;  D: rel = [0, 1] -> (1/2)(1/2) = 0.25
#   MAP@R = (0.5 + 0.5 + 0.25) / 3 = 5/12
FOUR = on_circle([0, 10, 30, 70])
FOUR_LABELS = [0, 0, 1, 0]


def test_recall_on_hand_computed_circle():
    assert recall_at_k(FOUR, FOUR_LABELS, ks=(1, 2, 3, 4)) == {1: 0.5, 2: 0.75, 3: 0.75, 4: 0.75}


def test_map_at_r_on_hand_computed_circle():
    assert map_at_r(FOUR, FOUR_LABELS) == pytest.approx(5 / 12)


# Five points at 0, 10, 25, 45, 70 degrees, labels 0, 1, 0, 0, 1 (class 0: R = 2, class 1: R = 1)
#   P0(0):  P1 P2 P3 P4   R=2, rel [0,1] -> (1/2)(1/2) = 0.25   first hit rank 2
#   P1(10): P0 P2 P3 P4   R=1, rel [0]   -> 0                   first hit rank 4
#   P2(25): P1 P3 P0 P4   R=2, rel [0,1] -> 0.25                first hit rank 2
#   P3(45): P2 P4 P1 P0   R=2, rel [1,0] -> (1/2)(1) = 0.5      first hit rank 1
#   P4(70): P3 P2 P1 P0   R=1, rel [0]   -> 0                   first hit rank 3
# MAP@R = 1.0 / 5 = 0.2; Recall@1 = 1/5, @2 = 3/5, @3 = 4/5, @4 = 5/5
FIVE = on_circle([0, 10, 25, 45, 70])
FIVE_LABELS = ["a", "b", "a", "a", "b"]  # string labels work too


def test_second_hand_computed_circle():
    assert map_at_r(FIVE, FIVE_LABELS) == pytest.approx(0.2)
    assert recall_at_k(FIVE, FIVE_LABELS, ks=(1, 2, 3, 4)) == pytest.approx(
        {1: 0.2, 2: 0.6, 3: 0.8, 4: 1.0}
    )


def test_duplicates_never_count_the_query_itself():
    """Five identical vectors of five different classes and two identical ones of one class:
    only the pair can find a same-class neighbour, whatever order faiss gives the ties."""
    vectors = np.concatenate([np.tile(on_circle([0]), (5, 1)), np.tile(on_circle([90]), (2, 1))])
    labels = [0, 1, 2, 3, 4, 5, 5]
    assert recall_at_k(vectors, labels, ks=(1, 2, 4, 6)) == pytest.approx(
        {1: 2 / 7, 2: 2 / 7, 4: 2 / 7, 6: 2 / 7}
    )
    assert map_at_r(vectors, labels) == 1.0  # only the pair is scored, and it is perfect


def test_duplicate_ranked_before_the_query():
    """Three identical vectors, ids 0 and 1 of class 1, id 2 alone in class 0, plus one vector
    of class 1 elsewhere. faiss may rank 0 or 1 before 2 for query 2: dropping the first result
    instead of the query's own id would count query 2 as its own neighbour."""
    vectors = np.concatenate([np.tile(on_circle([0]), (3, 1)), on_circle([60])])
    labels = [1, 1, 0, 1]
    # queries 0, 1 and 3 find class 1 within 2 (pigeonhole for 3); query 2 never can
    assert recall_at_k(vectors, labels, ks=(2, 3)) == {2: 0.75, 3: 0.75}


class FakeIndex:
    """Returns fixed search results, to place the query's own id where a tie would."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids

    def search(self, queries, k):
        assert k == self.ids.shape[1]
        return np.zeros(self.ids.shape, dtype=np.float32), self.ids


def test_neighbours_drop_own_id_wherever_it_is_or_the_last():
    ids = np.array(
        [
            [0, 5, 6, 7],  # self first
            [5, 6, 1, 7],  # self third (tied duplicates ranked before it)
            [5, 6, 7, 8],  # self absent (tied duplicates pushed it out): drop the last
        ]
    )
    queries = np.array([0, 1, 2])
    vectors = np.zeros((9, 2), dtype=np.float32)
    neighbours = metrics._neighbours_without_self(FakeIndex(ids), vectors, queries, 3)
    assert neighbours.tolist() == [[5, 6, 7], [5, 6, 7], [5, 6, 7]]


# ---------------------------------------------------------------- reference and chunking


def brute_force(
    vectors: np.ndarray, labels: np.ndarray, ks, queries=None
) -> tuple[dict[int, float], float]:
    """Loop reference: full similarity ranking per query (ties broken by id); ``queries``:
    the ids that query (default all)."""
    n = len(vectors)
    queries = range(n) if queries is None else queries
    similarity = vectors @ vectors.T
    hits = dict.fromkeys(ks, 0)
    aps = []
    for q in queries:
        others = [j for j in range(n) if j != q]
        ranked = sorted(others, key=lambda j: (-similarity[q, j], j))
        rel = [labels[j] == labels[q] for j in ranked]
        for k in ks:
            hits[k] += any(rel[:k])
        r = sum(rel)
        if r:
            precision_sum = 0.0
            correct = 0
            for i in range(r):
                if rel[i]:
                    correct += 1
                    precision_sum += correct / (i + 1)
            aps.append(precision_sum / r)
    return {k: hits[k] / len(queries) for k in ks}, float(np.mean(aps))


def random_gallery(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # uneven class sizes, some singletons: exercises the R-sorted chunks and R = 0
    labels = rng.integers(0, classes, size=n) ** 2 % (classes + 7)
    centres = rng.normal(size=(labels.max() + 1, dim))
    vectors = centres[labels] + 1.5 * rng.normal(size=(n, dim))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, labels


def test_matches_brute_force_reference():
    vectors, labels = random_gallery(150, 8, 12, seed=1)
    ks = (1, 2, 4, 8, 16, 500)
    expected_recall, expected_map = brute_force(vectors, labels, ks)
    assert recall_at_k(vectors, labels, ks) == pytest.approx(expected_recall, abs=1e-12)
    assert map_at_r(vectors, labels) == pytest.approx(expected_map, abs=1e-9)


def test_a_query_sample_searches_the_whole_gallery():
    vectors, labels = random_gallery(150, 8, 12, seed=2)
    ks = (1, 4, 16)
    sample = np.sort(np.random.default_rng(5).choice(150, size=40, replace=False))
    expected_recall, expected_map = brute_force(vectors, labels, ks, queries=sample)
    result = evaluate(vectors, labels, ks, seed=5, queries=40, chunk=7)
    assert result["queries"] == 40
    assert [result[f"recall@{k}"] for k in ks] == pytest.approx(
        [expected_recall[k] for k in ks], abs=1e-12
    )
    assert result["map@r"] == pytest.approx(expected_map, abs=1e-9)
    assert evaluate(vectors, labels, ks, queries=150) == evaluate(vectors, labels, ks)
    with pytest.raises(NearsightError, match="number of queries must be positive"):
        evaluate(vectors, labels, ks, queries=0)


def test_chunked_equals_unchunked(monkeypatch):
    vectors, labels = random_gallery(400, 16, 30, seed=2)
    ks = (1, 2, 4, 8, 100)
    whole = evaluate(vectors, labels, ks, chunk=4096)
    assert evaluate(vectors, labels, ks, chunk=3) == whole
    assert evaluate(vectors, labels, ks, chunk=1) == whole
    # the memory bound that shrinks chunks for deep searches
    monkeypatch.setattr(metrics, "_MAX_RESULTS_PER_CHUNK", 50)
    assert evaluate(vectors, labels, ks, chunk=4096) == whole
    monkeypatch.undo()
    # each search asks for at most `chunk` queries
    searched = []
    search = metrics._ExactIP.search
    monkeypatch.setattr(
        metrics._ExactIP,
        "search",
        lambda self, q, k: searched.append(len(q)) or search(self, q, k),
    )
    assert evaluate(vectors, labels, ks, chunk=7) == whole
    assert max(searched) == 7 and sum(searched) == 400


def test_exact_search_matches_faiss_flat_index():
    """The kNN keeps faiss.IndexFlatIP's search contract: same ids (no ties in random data),
    scores best first and equal to the inner products."""
    import faiss

    vectors, _ = random_gallery(300, 16, 10, seed=9)
    vectors = vectors.astype(np.float32)
    reference = faiss.IndexFlatIP(16)
    reference.add(vectors)
    expected_scores, expected_ids = reference.search(vectors[:50], 7)
    scores, ids = metrics._ExactIP(vectors).search(vectors[:50], 7)
    assert ids.dtype == np.int64 and ids.shape == (50, 7)
    assert ids.tolist() == expected_ids.tolist()
    assert scores == pytest.approx(expected_scores, abs=1e-6)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_accepts_float64_and_non_contiguous_input():
    vectors, labels = random_gallery(120, 6, 10, seed=3)
    as_float32 = recall_at_k(vectors.astype(np.float32), labels)
    fortran_order = np.asfortranarray(vectors)
    assert recall_at_k(fortran_order, labels) == as_float32
    assert recall_at_k(vectors[:, ::-1], labels) == as_float32  # a column permutation
    assert map_at_r(torch.from_numpy(vectors), labels) == map_at_r(vectors, labels)


def test_same_numbers_as_pytorch_metric_learning():
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    rng = np.random.default_rng(4)
    labels = rng.integers(0, 25, size=500)
    centres = rng.normal(size=(25, 32))
    vectors = centres[labels] + 2.0 * rng.normal(size=(500, 32))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)

    calculator = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r"), device=torch.device("cpu")
    )
    theirs = calculator.get_accuracy(torch.from_numpy(vectors), torch.from_numpy(labels))
    assert 0.1 < theirs["precision_at_1"] < 0.99  # a non-trivial case
    assert recall_at_k(vectors, labels, ks=(1,))[1] == pytest.approx(
        theirs["precision_at_1"], abs=1e-6
    )
    assert map_at_r(vectors, labels) == pytest.approx(
        theirs["mean_average_precision_at_r"], abs=1e-6
    )


# ---------------------------------------------------------------- NMI and evaluate


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("init", ["k-means++", "afk-mc2"])
def test_nmi_is_one_for_separated_clusters(seed, init):
    """Four tight clusters. (faiss's default random seeding often puts two starting centroids
    in one cluster and merges two others, NMI about 0.8.)"""
    rng = np.random.default_rng(5 + seed)
    centres = on_circle([0, 90, 180, 270])
    labels = np.repeat([3, 1, 0, 2], 15)
    vectors = centres[np.repeat([0, 1, 2, 3], 15)] + 0.01 * rng.normal(size=(60, 2))
    assert nmi(vectors, labels, seed=seed, init=init) == pytest.approx(1.0)


def test_nmi_seeds_in_numpy_when_faiss_lacks_init_methods(monkeypatch):
    monkeypatch.setitem(nmi_module.KMEANS_INITS, "k-means++", "NoSuchFaissAttribute")
    rng = np.random.default_rng(8)
    labels = np.repeat([0, 1, 2, 3], 15)
    vectors = on_circle([0, 90, 180, 270])[labels] + 0.01 * rng.normal(size=(60, 2))
    assert nmi(vectors, labels) == pytest.approx(1.0)


def test_nmi_bad_init():
    with pytest.raises(NearsightError, match="k-means init"):
        nmi(FOUR, FOUR_LABELS, init="forgy")


def test_nmi_matches_sklearn_on_a_known_assignment():
    """Two tight, far-apart clusters of 10; the first holds 8 items of class 0 and 2 of class
    1. k-means (k = 2 classes) must find the two clusters, so NMI is sklearn's value for that
    assignment."""
    rng = np.random.default_rng(6)
    cluster = np.repeat([0, 1], 10)
    vectors = on_circle([0, 180])[cluster] + 0.01 * rng.normal(size=(20, 2))
    labels = np.array([0] * 8 + [1] * 2 + [1] * 10)
    expected = normalized_mutual_info_score(labels, cluster)
    assert 0.2 < expected < 0.8
    assert nmi(vectors, labels) == pytest.approx(expected)
    assert nmi(vectors, labels, seed=7) == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(6))
def test_numpy_nmi_equals_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    n = [1, 7, 50, 400, 2000, 5000][seed]
    labels = rng.integers(0, [1, 3, 5, 40, 100, 7][seed], size=n)
    clusters = rng.integers(0, [1, 2, 9, 40, 80, 7][seed], size=n)
    if seed == 5:  # a labelling and a relabelled copy: NMI 1
        clusters = (labels * 3 + 1) % 7
    expected = normalized_mutual_info_score(labels, clusters)
    assert nmi_module.normalized_mutual_info(labels, clusters) == pytest.approx(expected, abs=1e-10)
    assert nmi_module.normalized_mutual_info(clusters, labels) == pytest.approx(expected, abs=1e-10)


def test_geometric_nmi_equals_scikit_learn_and_differs_from_arithmetic():
    """The balanced contrastive paper's NMI, I / sqrt(H(U) H(V)): scikit-learn's geometric
    average; on unequal entropies it is larger than the arithmetic one (AM >= GM)."""
    rng = np.random.default_rng(3)
    labels, clusters = rng.integers(0, 20, size=600), rng.integers(0, 5, size=600)
    clusters[:300] = labels[:300] % 5  # some agreement
    expected = normalized_mutual_info_score(labels, clusters, average_method="geometric")
    geometric = nmi_module.normalized_mutual_info(labels, clusters, average="geometric")
    assert geometric == pytest.approx(expected, abs=1e-10)
    assert geometric > nmi_module.normalized_mutual_info(labels, clusters) + 0.005
    with pytest.raises(NearsightError, match="arithmetic, geometric"):
        nmi_module.normalized_mutual_info(labels, clusters, average="harmonic")


def test_nmi_limit_cases_match_scikit_learn():
    for labels, clusters in (
        [[0, 0, 0], [1, 1, 1]],
        [[0, 1, 2], [0, 0, 0]],
        [[0, 0, 1, 1], [0, 1, 0, 1]],
    ):
        expected = normalized_mutual_info_score(labels, clusters)
        assert nmi_module.normalized_mutual_info(np.array(labels), np.array(clusters)) == expected


def test_metrics_import_neither_torch_nor_sklearn():
    """``nearsight eval`` is on the serving path: importing the metrics and evaluating must
    not load torch, scikit-learn or scipy."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from nearsight.data.metrics.retrieval import evaluate\n"
        "v = np.random.default_rng(0).normal(size=(50, 8)).astype('float32')\n"
        "v /= np.linalg.norm(v, axis=1, keepdims=True)\n"
        "evaluate(v, np.arange(50) % 5)\n"
        "print(sorted(m for m in ('torch', 'sklearn', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_evaluate_shape_and_values():
    result = evaluate(FOUR, FOUR_LABELS)
    assert list(result) == [
        "recall@1",
        "recall@2",
        "recall@4",
        "recall@8",
        "nmi",
        "map@r",
        "queries",
    ]
    assert result["recall@1"] == 0.5 and result["recall@2"] == 0.75 and result["recall@8"] == 0.75
    assert result["map@r"] == pytest.approx(5 / 12)
    assert result["queries"] == 4
    assert 0.0 <= result["nmi"] <= 1.0
    assert all(isinstance(v, float) for k, v in result.items() if k != "queries")


def test_map_at_r_is_nan_when_every_class_is_a_singleton():
    assert math.isnan(map_at_r(FOUR, [0, 1, 2, 3]))


def test_default_ks():
    assert default_ks(5_924) == CUB_KS == (1, 2, 4, 8)
    assert default_ks(60_502) == SOP_KS == (1, 10, 100, 1000)


@pytest.mark.parametrize(
    ("vectors", "labels", "message"),
    [
        (np.zeros((1, 4)), [0], "at least 2 items"),
        (np.zeros((3, 4)), [0, 1], "one per embedding"),
        (np.zeros(4), [0, 1, 2, 3], "2-D"),
        (np.array([[1.0, 0.0], [np.nan, 0.0]]), [0, 0], "NaN"),
    ],
)
def test_bad_input_is_a_one_line_error(vectors, labels, message):
    with pytest.raises(NearsightError, match=message):
        recall_at_k(vectors, labels)


def test_bad_ks():
    with pytest.raises(NearsightError, match="positive"):
        recall_at_k(FOUR, FOUR_LABELS, ks=(0, 1))
