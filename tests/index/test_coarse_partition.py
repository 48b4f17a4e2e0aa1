"""The coarse partition of an HNSW gallery (nearsight.index.ann.coarse): the exact way of a
filtered search reading only the lists nearest the query, against a float64 brute force over
the allowed items; a gallery without the partition answering as before; added items read."""

from __future__ import annotations

import numpy as np
import pytest

from nearsight.index.ann import coarse, filtered
from nearsight.index.ann.filter_plan import TARGET_RECALL, Costs
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.write import write_gallery

COUNT, DIM, CLUSTERS, K = 6000, 24, 60, 10


@pytest.fixture(scope="module")
def data() -> dict:
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((CLUSTERS, DIM)).astype(np.float32)
    label = rng.integers(0, CLUSTERS, COUNT + 60)
    points = centres[label] + 0.4 * rng.standard_normal((COUNT + 60, DIM)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    vectors, queries = points[:COUNT], points[COUNT:]
    along = vectors @ rng.standard_normal(DIM).astype(np.float32)
    own = set(label[COUNT:].tolist())
    away = [c for c in rng.permutation(CLUSTERS) if c not in own]
    filters = {
        "cap 20%": np.sort(np.argsort(-along, kind="stable")[: COUNT // 5]),
        "category": np.flatnonzero(np.isin(label[:COUNT], away[:12])),
        "random 30%": np.sort(rng.choice(COUNT, int(0.3 * COUNT), replace=False)),
        "few": np.sort(rng.choice(COUNT, 7, replace=False)),  # fewer than k
    }
    return {"vectors": vectors, "queries": queries, "filters": filters}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, data):
    items = [{"path": f"/shop/{i}.jpg"} for i in range(COUNT)]
    return write_gallery(tmp_path_factory.mktemp("coarse") / "g", data["vectors"], items,
                         model_sha256="c" * 64, index_type="hnsw")  # fmt: skip


def brute_force(queries: np.ndarray, vectors: np.ndarray, allowed: np.ndarray, k: int = K):
    scores = queries.astype(np.float64) @ vectors[allowed].astype(np.float64).T
    return allowed[np.argsort(-scores, axis=1, kind="stable")[:, :k]]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    pairs = zip(found.tolist(), truth.tolist(), strict=True)
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in pairs]))


def coarse_search(folder, queries, allowed, monkeypatch, beta: float | None = None):
    monkeypatch.setattr(filtered, "FORCE", "coarse")
    with Gallery.open(folder) as gallery:
        if beta is not None:
            assert gallery._filters.partition is not None
            gallery._filters.partition.beta = beta
        info: dict = {}
        distances, ids = gallery.search(queries, K, ids=allowed, info=info)
    return distances, ids, info


def test_an_hnsw_build_stores_a_partition_tuned_to_the_target(folder):
    partition = coarse.read_partition(folder)
    assert partition is not None
    assert partition.beta in coarse.BETAS and partition.tuned_recall >= TARGET_RECALL
    assert 8 <= partition.nlist <= 4 * int(np.sqrt(COUNT))
    assert partition.list_of.shape == (COUNT,) and (partition.list_of >= 0).all()
    assert partition.list_of.max() < partition.nlist


@pytest.mark.parametrize("name", ["cap 20%", "category", "random 30%", "few"])
def test_the_lists_nearest_the_query_reach_the_target_against_the_brute_force(
    folder, data, name, monkeypatch
):
    allowed = data["filters"][name]
    distances, ids, info = coarse_search(folder, data["queries"], allowed, monkeypatch)
    depth = min(K, len(allowed))
    assert info["coarse"] == len(data["queries"]) and info["exact"] == info["index"] == 0
    assert ids.shape == (len(data["queries"]), depth) and np.isin(ids, allowed).all()
    # the distances are the exact ones of the items returned, in order
    exact = np.linalg.norm(data["queries"][:, None, :] - data["vectors"][ids], axis=2)
    np.testing.assert_allclose(distances, exact, atol=1e-4)
    assert (np.diff(distances, axis=1) >= -1e-6).all()
    assert recall(ids, brute_force(data["queries"], data["vectors"], allowed, depth)) >= 0.99


@pytest.mark.parametrize("name", ["cap 20%", "category"])
def test_reading_every_list_is_the_brute_force(folder, data, name, monkeypatch):
    allowed = data["filters"][name]
    _, ids, _ = coarse_search(folder, data["queries"], allowed, monkeypatch, beta=1e9)
    np.testing.assert_array_equal(ids, brute_force(data["queries"], data["vectors"], allowed))


def test_a_narrow_rule_reads_fewer_items_and_only_nearest_lists(folder, data):
    partition = coarse.read_partition(folder)
    assert partition is not None
    allowed = data["filters"]["cap 20%"]
    partition.beta = 1.0
    plan = partition.plan(data["queries"], allowed, K)
    assert (plan.scanned < len(allowed)).all() and (plan.scanned >= K).all()
    for q, query in enumerate(data["queries"][:5]):
        read = plan.ids(q, allowed)
        lists = set(partition.list_of[read].tolist())
        assert len(read) == plan.scanned[q] and np.isin(read, allowed).all()
        # every list holding allowed items nearer the query than one read is read too
        scores = partition.centroids @ query
        held = set(partition.list_of[allowed].tolist())
        worst = min(scores[list(lists)])
        assert {n for n in held if scores[n] > worst} <= lists


def test_a_gallery_built_before_the_partition_answers_as_before(folder, data, tmp_path,
                                                                monkeypatch):  # fmt: skip
    old = tmp_path / "old"
    old.mkdir()
    for path in folder.iterdir():
        if path.is_file() and path.name != coarse.PARTITION_FILE:
            (old / path.name).write_bytes(path.read_bytes())
    allowed = data["filters"]["cap 20%"]
    _, forced, info = coarse_search(old, data["queries"], allowed, monkeypatch)
    assert info["coarse"] == 0  # no partition: the plain exact search
    np.testing.assert_array_equal(forced, brute_force(data["queries"], data["vectors"], allowed))
    monkeypatch.setattr(filtered, "FORCE", None)
    with Gallery.open(old) as gallery, Gallery.open(folder) as new:
        assert gallery._filters.partition is None and new._filters.partition is not None
        new._filters.partition = None  # the same gallery as main's route sees it
        for name, allowed in data["filters"].items():
            info = {}
            got = gallery.search(data["queries"], K, ids=allowed, info=info)
            want = new.search(data["queries"], K, ids=allowed)
            assert info["coarse"] == 0
            np.testing.assert_array_equal(got[1], want[1], err_msg=name)


def test_items_added_after_the_build_are_always_read_and_compaction_keeps_it(
    folder, data, tmp_path, monkeypatch
):
    copy = tmp_path / "g"
    copy.mkdir()
    for path in folder.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    queries = data["queries"][:8]
    with Gallery.open(copy) as gallery:  # each query's own vector, added: its nearest item
        added = gallery.add(queries, [{"path": f"/shop/new{i}.jpg"} for i in range(len(queries))])
    added = np.asarray(added)
    allowed = np.union1d(data["filters"]["cap 20%"], added)
    _, ids, info = coarse_search(copy, queries, allowed, monkeypatch, beta=1.0)
    assert info["coarse"] == len(queries)
    np.testing.assert_array_equal(ids[:, 0], added)
    with Gallery.open(copy) as gallery:
        gallery.remove([int(added[0])])  # HNSW: a compaction
    assert (copy / coarse.PARTITION_FILE).is_file()
    _, ids, _ = coarse_search(copy, queries[1:], np.setdiff1d(allowed, added[:1]), monkeypatch)
    np.testing.assert_array_equal(ids[:, 0], added[1:])


def test_the_route_reads_the_nearest_lists_where_they_cost_less(folder, data, monkeypatch):
    """Costs where a walk never pays and an exact search costs its items: every query reads
    the lists nearest it, and the answer keeps the target against the brute force."""
    partition = coarse.read_partition(folder)
    assert partition is not None
    along = data["vectors"] @ data["vectors"][0]  # a cap, away from most queries
    count = int(2.5 * partition.beta * partition.mean_list())
    assert count < COUNT // 2
    allowed = np.sort(np.argsort(-along, kind="stable")[:count])
    monkeypatch.setattr(filtered, "FORCE", None)
    with Gallery.open(folder) as gallery:
        gallery._filters.costs = Costs(0.0, 1.0, 1e6, 1.0)
        info: dict = {}
        _, ids = gallery.search(data["queries"], K, ids=allowed, info=info)
        assert info["coarse"] == len(data["queries"]) and info["exact"] == 0
        gallery._filters.partition.beta = 1e9  # a rule that reads every list: never taken
        gallery.search(data["queries"], K, ids=allowed, info=info)
        assert info["coarse"] == 0 and info["exact"] == len(data["queries"])
    assert recall(ids, brute_force(data["queries"], data["vectors"], allowed)) >= 0.99
