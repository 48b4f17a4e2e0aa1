"""Re-ranking wired into gallery search and evaluation, against float64 loop references."""

import numpy as np
import pytest

from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.write import write_gallery
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.rerank import k_reciprocal_distance, parse_rerank
from nearsight.search.rerank.search import reranked_search
from nearsight.search.route import stored_rerank

SHA = "ab" * 32


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _clustered(classes=6, per=6, dim=8, noise=0.9, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), per)
    vectors = _unit(centres[labels] + noise * rng.normal(size=(len(labels), dim)))
    return vectors.astype(np.float32), labels


def _gallery(tmp_path, vectors, labels, index_type="flat", name="g"):
    items = [
        {"path": f"/data/{i}.png", "label": int(label), "class_name": f"c{label}"}
        for i, label in enumerate(labels)
    ]
    return write_gallery(tmp_path / name, vectors, items, model_sha256=SHA, index_type=index_type)


def _dba_vector(v, c, q, k, alpha, exclude_query=True):
    """Candidate c's DBA vector from its top-k items other than itself (and the query q)."""
    others = [j for j in range(len(v)) if j != c and (j != q or not exclude_query)]
    sims = sorted(((float(v[c] @ v[j]), j) for j in others), key=lambda t: (-t[0], t[1]))
    acc = v[c].astype(np.float64).copy()
    for s, j in sims[:k]:
        acc += max(s, 0.0) ** alpha * v[j]
    return acc / np.linalg.norm(acc)


def _loop_ranking(v, q, spec, exclude_query=True):
    """Leave-one-out ranking of every other item for query q under spec, in float64 loops."""
    p = spec.params
    v = v.astype(np.float64)
    ranked = sorted((j for j in range(len(v)) if j != q), key=lambda j: (-float(v[q] @ v[j]), j))
    cands, rest = ranked[: spec.depth], ranked[spec.depth :]  # deeper ranks keep their order
    vecs = {j: v[j] for j in cands}
    if spec.method in ("dba", "dba+aqe"):
        vecs = {j: _dba_vector(v, j, q, int(p["k"]), p["alpha"], exclude_query) for j in cands}
    query = v[q]
    if spec.method in ("aqe", "dba+aqe"):
        top = sorted(cands, key=lambda j: -float(query @ vecs[j]))[: int(p["k"])]
        acc = query.copy()
        for j in top:
            acc += max(float(query @ vecs[j]), 0.0) ** p["alpha"] * vecs[j]
        query = acc / np.linalg.norm(acc)
    if spec.method == "kreciprocal":
        cand = np.stack([vecs[j] for j in cands])[None]
        dist = k_reciprocal_distance(query[None], cand, int(p["k1"]), int(p["k2"]), p["lambda"])[0]
        score = dict(zip(cands, -dist, strict=True))
    else:
        score = {j: float(query @ vecs[j]) for j in cands}
    return sorted(cands, key=lambda j: -score[j]) + rest


def _loop_metrics(v, labels, spec, exclude_query=True):
    hits, aps = [], []
    for q in range(len(v)):
        ranking = _loop_ranking(v, q, spec, exclude_query)
        same = labels[ranking] == labels[q]
        r = int((labels == labels[q]).sum()) - 1
        hits.append(bool(same[0]))
        rel = same[:r]
        aps.append(float((np.cumsum(rel) / np.arange(1, r + 1) * rel).sum() / r))
    return float(np.mean(hits)), float(np.mean(aps))


SPECS = ["aqe:k=2,alpha=3", "dba:k=2,alpha=1", "dba+aqe:k=3,alpha=2", "kreciprocal:k1=6,k2=3"]
# depth under R (5 other items of a class): MAP@R reaches past the re-ranked candidates
SHALLOW = [
    "aqe:k=2,alpha=3,depth=3",
    "dba+aqe:k=2,alpha=2,depth=2",
    "kreciprocal:k1=3,k2=2,depth=4",
]


@pytest.mark.parametrize("text", SPECS + SHALLOW)
def test_evaluate_with_rerank_matches_leave_one_out_loop(tmp_path, text):
    vectors, labels = _clustered()
    spec = parse_rerank(text)
    with Gallery.open(_gallery(tmp_path, vectors, labels)) as gallery:
        got = evaluate_gallery(gallery, ks=(1,), rerank=spec)
        plain = evaluate_gallery(gallery, ks=(1,))
    recall, mean_ap = _loop_metrics(vectors, labels, spec)
    assert got["recall@1"] == pytest.approx(recall, abs=1e-9)
    assert got["map@r"] == pytest.approx(mean_ap, abs=1e-9)
    assert got["nmi"] == plain["nmi"]  # clustering is not re-ranked


def test_dba_evaluation_never_reaches_the_query_through_its_neighbours(tmp_path):
    # letting the query into its candidates' DBA sums changes the scores here, so agreeing
    # with the reference that keeps it out is a real check
    vectors, labels = _clustered(seed=3)
    spec = parse_rerank("dba:k=3,alpha=1")
    with Gallery.open(_gallery(tmp_path, vectors, labels)) as gallery:
        got = evaluate_gallery(gallery, ks=(1,), rerank=spec)
    honest = _loop_metrics(vectors, labels, spec)
    leaky = _loop_metrics(vectors, labels, spec, exclude_query=False)
    assert abs(leaky[1] - honest[1]) > 1e-3
    assert got["map@r"] == pytest.approx(honest[1], abs=1e-9)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivfpq"])
@pytest.mark.parametrize("text", SPECS)
def test_gallery_search_reranks_on_every_index_type(tmp_path, index_type, text):
    vectors, labels = _clustered(classes=30, per=10, dim=16, noise=0.7, seed=1)
    spec = parse_rerank(text + ",depth=20")
    queries = vectors[:12]
    with Gallery.open(_gallery(tmp_path, vectors, labels, index_type)) as gallery:
        distances, ids = reranked_search(gallery, queries, 5, spec, exclude=np.arange(12))
    with Gallery.open(_gallery(tmp_path, vectors, labels, "flat", "ref")) as flat:
        want_d, want = reranked_search(flat, queries, 5, spec, exclude=np.arange(12))
    assert ids.shape == distances.shape == (12, 5)
    assert not (ids == np.arange(12)[:, None]).any()  # the excluded query never comes back
    assert (np.diff(distances, axis=1) >= 0).all()
    if index_type == "flat":
        np.testing.assert_array_equal(ids, want)
    else:  # approximate candidates and neighbour lists (2-bit PQ codes at 300 items)
        assert (ids[:, 0] == want[:, 0]).mean() >= 0.75


def test_search_rerank_matches_the_loop_reference(tmp_path):
    vectors, labels = _clustered()
    spec = parse_rerank("dba+aqe:k=2,alpha=3,depth=40")
    with Gallery.open(_gallery(tmp_path, vectors, labels)) as gallery:
        _, ids = reranked_search(gallery, vectors, len(vectors) - 1, spec, exclude=np.arange(36))
    for q in range(len(vectors)):
        assert ids[q].tolist() == _loop_ranking(vectors, q, spec)


def test_the_stored_choice_survives_add_remove_and_compact(tmp_path):
    from nearsight.index.gallery.change import set_meta

    vectors, labels = _clustered(classes=6, per=8, seed=4)
    folder = _gallery(tmp_path, vectors[:40], labels[:40])
    spec = parse_rerank("dba:k=2,alpha=3,depth=20")
    with Gallery.open(folder) as gallery:
        set_meta(gallery, rerank=str(spec))
        assert stored_rerank(gallery) == spec
        new = gallery.add(vectors[40:], [{"path": f"/n/{i}.png", "label": int(label),
                                          "class_name": None} for i, label in enumerate(labels[40:])])  # fmt: skip
        gallery.remove([0, 1])
        # the added items are found and re-ranked, the removed never come back
        _, ids = reranked_search(gallery, vectors[40:44], 5, spec)
        assert set(new[:4]) <= set(ids[:, 0].tolist()) and not np.isin(ids, [0, 1]).any()
        gallery.compact()
        assert stored_rerank(gallery) == spec
    with Gallery.open(folder) as reopened:
        assert stored_rerank(reopened) == spec
        _, after = reranked_search(reopened, vectors[40:44], 5, spec)
    np.testing.assert_array_equal(after, ids)


def _neighbour_lists(gallery, keys, depth):
    from nearsight.search.rerank.sources import OpenGallerySource

    return OpenGallerySource(gallery).neighbours(np.asarray(keys), depth)


def test_the_neighbour_graph_answers_as_the_index_does_through_add_remove_compact(tmp_path):
    from nearsight.index.gallery.graph import GRAPH_FILE

    vectors, labels = _clustered(classes=8, per=10, dim=12, seed=5)
    items = [
        {"path": f"/d/{i}.png", "label": int(x), "class_name": None} for i, x in enumerate(labels)
    ]
    with_graph = write_gallery(tmp_path / "graph", vectors[:60], items[:60], model_sha256=SHA,
                               index_type="flat", neighbour_graph=True)  # fmt: skip
    plain = write_gallery(tmp_path / "plain", vectors[:60], items[:60], model_sha256=SHA,
                          index_type="flat")  # fmt: skip
    assert (with_graph / GRAPH_FILE).exists() and not (plain / GRAPH_FILE).exists()
    spec = parse_rerank("dba+aqe:k=3,alpha=2,depth=30")
    with Gallery.open(with_graph) as g, Gallery.open(plain) as p:
        assert g._graph is not None and p._graph is None

        def same_answers(keys):
            for depth in (1, 4, 16, 20):  # 20: past the graph's depth, searched
                got, want = _neighbour_lists(g, keys, depth), _neighbour_lists(p, keys, depth)
                np.testing.assert_array_equal(got[1], want[1])
                np.testing.assert_allclose(got[0], want[0], atol=1e-5)
            np.testing.assert_array_equal(
                reranked_search(g, vectors, 6, spec)[1], reranked_search(p, vectors, 6, spec)[1]
            )

        same_answers(g.ids)
        for gallery in (g, p):
            gallery.add(vectors[60:], items[60:])  # a segment: merged into the rows exactly
            gallery.remove([1, 2, 3, 30])  # masked out of the rows
        same_answers(g.ids)
        g.compact()
        assert g._graph[0].shape == (76, 16)  # rebuilt for the new base
        same_answers(g.ids)


def test_a_graph_that_does_not_match_the_index_is_refused(tmp_path):
    from nearsight.index.catalog.store import GalleryError
    from nearsight.index.gallery.graph import GRAPH_FILE

    vectors, labels = _clustered()
    items = [
        {"path": f"/d/{i}.png", "label": int(x), "class_name": None} for i, x in enumerate(labels)
    ]
    folder = write_gallery(tmp_path / "g", vectors, items, model_sha256=SHA, neighbour_graph=True)
    np.save(folder / GRAPH_FILE, np.zeros((3, 16), dtype=np.int64))
    with pytest.raises(GalleryError, match="neighbour graph of 3 rows for 36 indexed items"):
        Gallery.open(folder)


def test_plain_search_leaves_the_excluded_item_out_too(tmp_path):
    vectors, labels = _clustered()
    with Gallery.open(_gallery(tmp_path, vectors, labels)) as gallery:
        distances, ids = gallery.search(vectors, 4, exclude=np.arange(36))
        deeper_d, deeper = gallery.search(vectors, 5)
    assert ids.shape == (36, 4) and not (ids == np.arange(36)[:, None]).any()
    for q in range(36):
        keep = deeper[q] != q
        assert ids[q].tolist() == deeper[q][keep][:4].tolist()
        np.testing.assert_array_equal(distances[q], deeper_d[q][keep][:4])
