"""Filtered search on every index type (flat, ivf, hnsw, ivfpq, opq) against a float64 brute
force over the matching items, both ways index.ann.filtered searches (exactly over few matches,
through the index with an ID selector past that), and the rule that refuses a PQ index on too
few items to train."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ONNX_CLASSES, ONNX_PER_CLASS, assert_one_line_error, run

from nearsight.core.errors import NearsightError
from nearsight.index.ann import filtered
from nearsight.index.ann.faiss_index import PQ_MIN_ITEMS, min_items
from nearsight.index.ann.index_choice import choose_index_type, resolve_index_type
from nearsight.index.catalog.store import CATALOG_FILE, Catalog
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.write import write_gallery

TYPES = ("flat", "ivf", "hnsw", "ivfpq", "opq")
COUNT, DIM, K = 1200, 16, 10
# narrow (1-3 matches, fewer than k), medium (about 10%), broad (about half), and two conditions
FILTERS = {
    "narrow": ["rank>=1197"],
    "medium": ["label=3"],
    "broad": ["rank<600"],
    "combined": ["label!=0", "rank>=300", "rank<1000"],
}


def unit_vectors(count: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def catalog_rows(count: int) -> list[dict]:
    ranks = np.random.default_rng(7).permutation(count)  # a numeric column unrelated to the ids
    return [
        {"path": f"/shop/{i}.jpg", "label": i % 10, "class_name": f"c{i % 10}",
         "meta": {"rank": int(ranks[i])}}
        for i in range(count)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return unit_vectors(COUNT, DIM, seed=0)


@pytest.fixture(scope="module")
def galleries(tmp_path_factory, vectors) -> dict:
    root = tmp_path_factory.mktemp("filtered")
    return {
        index_type: write_gallery(root / index_type, vectors, catalog_rows(COUNT),
                                  model_sha256="f" * 64, index_type=index_type)
        for index_type in TYPES
    }  # fmt: skip


@pytest.fixture(params=["shipped", "index"])
def way(request, monkeypatch) -> str:
    """``shipped``: as Gallery.search chooses; ``index``: every filter through the FAISS index
    with its ID selector (no exact search over few matches), so both ways are tested."""
    if request.param == "index":
        monkeypatch.setattr(filtered, "FORCE", "index")
    return request.param


def brute_force(queries: np.ndarray, vectors: np.ndarray, allowed: np.ndarray, k: int):
    """float64 (scores [Q, k] best first, ids [Q, k]) over the allowed items only."""
    scores = queries.astype(np.float64) @ vectors[allowed].astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), allowed[order]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    pairs = zip(found.tolist(), truth.tolist(), strict=True)
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in pairs]))


@pytest.mark.parametrize("index_type", TYPES)
@pytest.mark.parametrize("name", FILTERS)
def test_filtered_search_is_the_brute_force_over_the_matching_items(
    galleries, vectors, index_type, name, way
):
    queries = unit_vectors(40, DIM, seed=1)
    with Gallery.open(galleries[index_type]) as gallery:
        allowed = gallery.filter_ids(FILTERS[name])
        distances, ids = gallery.search(queries, K, ids=allowed)
    expected = {"narrow": 3, "medium": 120, "broad": 600}.get(name)
    assert expected is None or len(allowed) == expected
    depth = min(K, len(allowed))
    assert ids.shape == distances.shape == (len(queries), depth)  # min(k, matches)
    assert np.isin(ids, allowed).all()  # every item returned matches, none missing (-1)
    assert (np.diff(distances, axis=1) >= 0).all()
    # the distances shown are the exact ones of the items returned
    exact = np.linalg.norm(queries[:, None, :].astype(np.float64) - vectors[ids], axis=2)
    np.testing.assert_allclose(distances, exact, atol=1e-3)
    truth_scores, truth = brute_force(queries, vectors, allowed, depth)
    exact_route = index_type == "flat" or (way == "shipped" and len(allowed) <= K * 10)
    if exact_route or len(allowed) <= depth:
        # the true top-k: the same items, or items at the same distance (ties)
        truth_distances = np.sqrt(np.maximum(0.0, 2 - 2 * truth_scores))
        np.testing.assert_allclose(distances, truth_distances, atol=1e-5)
        assert (ids == truth).mean() >= 0.99
    else:  # approximate index: its recall, with exact distances for what it returns
        assert recall(ids, truth) >= 0.9


@pytest.mark.parametrize("index_type", TYPES)
def test_forced_exact_filtered_search_is_the_brute_force_on_every_type(
    galleries, vectors, index_type, monkeypatch
):
    """The exact way (what the plan picks where it is cheaper) is the true top-k whatever the
    index."""
    monkeypatch.setattr(filtered, "FORCE", "exact")
    queries = unit_vectors(40, DIM, seed=2)
    allowed = np.arange(0, COUNT, 3)
    with Gallery.open(galleries[index_type]) as gallery:
        info: dict = {}
        _, ids = gallery.search(queries, K, ids=allowed, info=info)
    assert info["exact"] == len(queries)
    np.testing.assert_array_equal(ids, brute_force(queries, vectors, allowed, K)[1])


@pytest.mark.parametrize("index_type", ["ivfpq", "opq"])
def test_a_pq_gallery_of_codes_only_answers_filters_in_the_codes_order(
    tmp_path, vectors, index_type
):
    """No embeddings.npy and no vector source: nothing exact to re-rank by. A filter still
    gets min(k, matches) matching items, nearest by the decoded codes."""
    folder = write_gallery(tmp_path / "g", vectors, catalog_rows(COUNT), model_sha256="f" * 64,
                           index_type=index_type, embeddings="drop")  # fmt: skip
    queries = unit_vectors(20, DIM, seed=3)
    with Gallery.open(folder) as gallery:
        assert not gallery.vectors_exact
        for filters in FILTERS.values():
            allowed = gallery.filter_ids(filters)
            distances, ids = gallery.search(queries, K, ids=allowed)
            assert ids.shape == (len(queries), min(K, len(allowed)))
            assert np.isin(ids, allowed).all() and np.isfinite(distances).all()
            truth = brute_force(queries, vectors, allowed, ids.shape[1])[1]
            # 3-bit codes of random vectors: rough (0.38-0.64 over seeds), chance is 0.02-0.08
            assert recall(ids, truth) >= 0.25


def test_hnsw_filters_skip_removed_items_a_compaction_has_not_dropped_yet(tmp_path, vectors):
    """HNSW cannot drop points, so `remove` compacts at once; were that compaction killed, the
    catalog would list removed ids the graph still holds: filtered searches never return them."""
    folder = write_gallery(tmp_path / "g", vectors, catalog_rows(COUNT), model_sha256="f" * 64,
                           index_type="hnsw")  # fmt: skip
    removed = np.arange(0, 200)
    with Catalog.open(folder / CATALOG_FILE) as catalog:  # the remove, without its compaction
        catalog.remove(removed.tolist(), meta={"removed": removed.tolist(),
                                               "count": COUNT - len(removed)})  # fmt: skip
    with Gallery.open(folder) as gallery:
        assert len(gallery) == COUNT - len(removed)
        for allowed in (np.arange(0, 400, 2), np.arange(0, 1000)):  # exact, then the index
            distances, ids = gallery.search(vectors[:30], K, ids=allowed)
            live = allowed[allowed >= 200]
            assert ids.shape == (30, K) and np.isin(ids, live).all()
        _, ids = gallery.search(vectors[:30], K)  # unfiltered: the graph skips them too
        assert not np.isin(ids, removed).any()


def test_filtered_search_of_an_added_item_on_a_pq_gallery(tmp_path, vectors):
    """Items appended after the build (segments) are found by a filter on a PQ gallery, with
    their exact vectors."""
    folder = write_gallery(tmp_path / "g", vectors[:1000], catalog_rows(1000),
                           model_sha256="f" * 64, index_type="opq")  # fmt: skip
    with Gallery.open(folder) as gallery:
        new = gallery.add(vectors[1000:1010], [{"path": f"/new/{i}.jpg", "label": 11}
                                               for i in range(10)])  # fmt: skip
        allowed = gallery.filter_ids(["label=11"])
        assert allowed.tolist() == new
        distances, ids = gallery.search(vectors[1000:1003], 5, ids=allowed)
    assert ids[:, 0].tolist() == new[:3] and distances[:, 0].max() < 1e-3


# -- too few items to train a PQ index --------------------------------------------------------


@pytest.mark.parametrize("index_type, count, dim, needed", [
    ("ivfpq", PQ_MIN_ITEMS - 1, 16, PQ_MIN_ITEMS),
    ("opq", PQ_MIN_ITEMS - 1, 16, PQ_MIN_ITEMS),
    ("opq", 300, 512, 512),  # OPQ's rotation: an item per dimension
])  # fmt: skip
def test_a_pq_index_on_too_few_items_is_refused_in_one_line(tmp_path, index_type, count, dim,
                                                            needed):  # fmt: skip
    assert min_items(index_type, dim) == needed
    with pytest.raises(NearsightError, match=f"needs at least {needed} items") as error:
        write_gallery(tmp_path / "g", unit_vectors(count, dim, 0), catalog_rows(count),
                      model_sha256="f" * 64, index_type=index_type)  # fmt: skip
    assert "\n" not in str(error.value) and f"there are {count}" in str(error.value)
    assert not (tmp_path / "g").exists()


def test_a_pq_index_on_just_enough_items_builds_and_filters(tmp_path):
    count = PQ_MIN_ITEMS
    vectors = unit_vectors(count, DIM, 4)
    for index_type in ("ivfpq", "opq"):
        folder = write_gallery(tmp_path / index_type, vectors, catalog_rows(count),
                               model_sha256="f" * 64, index_type=index_type)  # fmt: skip
        with Gallery.open(folder) as gallery:
            assert gallery.index_type == index_type
            _, ids = gallery.search(vectors[:5], 3, ids=gallery.filter_ids(["label=2"]))
            assert np.isin(ids, np.arange(2, count, 10)).all() and ids.shape == (5, 3)


def test_auto_picks_no_pq_type_it_cannot_train():
    assert resolve_index_type("auto", 500, 16) == "flat"  # auto's PQ starts far above the floor
    tiny_budget = 1 << 10
    assert choose_index_type(1_500, 128, tiny_budget) == "opq"
    assert choose_index_type(1_500, 2_048, tiny_budget) == "ivfpq"  # fewer items than dims


def test_index_import_refuses_a_pq_type_on_too_few_vectors(tmp_path, capsys):
    np.save(tmp_path / "v.npy", unit_vectors(100, DIM, 5))
    (tmp_path / "meta.csv").write_text("path\n" + "".join(f"/i/{i}.jpg\n" for i in range(100)))
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "v.npy", "--meta",
                       tmp_path / "meta.csv", "--out", tmp_path / "g", "--index-type", "opq")  # fmt: skip
    assert_one_line_error(code, err, "index type opq needs at least 256 items", "there are 100")
    assert not (tmp_path / "g").exists()


def test_index_build_refuses_a_pq_type_before_embedding(onnx_gallery, tmp_path, capsys):
    code, _, err = run(capsys, "index", "build", "--model", onnx_gallery.model, "--dataset",
                       "folder", "--root", onnx_gallery.data, "--split", "all", "--out",
                       tmp_path / "g", "--index-type", "ivfpq", "--workers", "0")  # fmt: skip
    count = ONNX_CLASSES * ONNX_PER_CLASS
    assert_one_line_error(code, err, "index type ivfpq needs at least 256 items",
                          f"there are {count}")  # fmt: skip
    assert not (tmp_path / "g").exists() and not (tmp_path / ".g.chunks").exists()


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize("index_type", ["ivfpq", "opq"])
def test_cli_search_with_filters_on_a_pq_gallery(galleries, index_type, capsys):
    """Was a FAISS RuntimeError traceback and exit 1 (IndexIVF::search got plain
    SearchParameters; opq's rotation got none it could pass on)."""
    import json

    code, out, err = run(capsys, "search", "--gallery", galleries[index_type], "--id", 13,
                         "--k", 5, "--filter", "label=3", "--json")  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err
    rows = json.loads(out)
    assert len(rows) == 5 and all(row["label"] == 3 for row in rows)
    assert rows[0]["id"] == 13  # the item itself, nearest
