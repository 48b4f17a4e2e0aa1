"""Re-ranking wired into gallery search and evaluation, against float64 loop references."""

import numpy as np
import pytest

from nearsight.index.gallery.core import Gallery, build_gallery
from nearsight.index.rerank import k_reciprocal_distance, parse_rerank

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
    return build_gallery(tmp_path / name, vectors, items, model_sha256=SHA, index_type=index_type)


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
    cands = sorted((j for j in range(len(v)) if j != q), key=lambda j: (-float(v[q] @ v[j]), j))
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
    return sorted(cands, key=lambda j: -score[j])


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


@pytest.mark.parametrize("text", SPECS)
def test_evaluate_with_rerank_matches_leave_one_out_loop(tmp_path, text):
    vectors, labels = _clustered()
    spec = parse_rerank(text)
    with Gallery.open(_gallery(tmp_path, vectors, labels)) as gallery:
        got = gallery.evaluate(ks=(1,), rerank=spec)
        plain = gallery.evaluate(ks=(1,))
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
        got = gallery.evaluate(ks=(1,), rerank=spec)
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
        distances, ids = gallery.search(queries, 5, rerank=spec, exclude=np.arange(12))
    with Gallery.open(_gallery(tmp_path, vectors, labels, "flat", "ref")) as flat:
        want_d, want = flat.search(queries, 5, rerank=spec, exclude=np.arange(12))
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
        _, ids = gallery.search(vectors, len(vectors) - 1, rerank=spec, exclude=np.arange(36))
    for q in range(len(vectors)):
        assert ids[q].tolist() == _loop_ranking(vectors, q, spec)
