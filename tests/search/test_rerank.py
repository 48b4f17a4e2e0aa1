"""Re-rankers against float64 loop references on small hand-built galleries."""

import numpy as np
import pytest

from nearsight.search.rerank import alpha_qe, k_reciprocal_distance, parse_rerank
from nearsight.search.rerank.dba import dba


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _data(seed=0, q=3, n=12, d=5):
    rng = np.random.default_rng(seed)
    return _unit(rng.normal(size=(q, d))), _unit(rng.normal(size=(q, n, d)))


def test_alpha_qe_matches_loop():
    queries, cand = _data()
    out = alpha_qe(queries, cand, k=3, alpha=3.0)
    for qi in range(len(queries)):
        sims = [float(queries[qi] @ c) for c in cand[qi]]
        order = sorted(range(len(sims)), key=lambda i: -sims[i])[:3]
        acc = queries[qi].copy()
        for i in order:
            acc += max(sims[i], 0.0) ** 3 * cand[qi][i]
        np.testing.assert_allclose(out[qi], acc / np.linalg.norm(acc), atol=1e-12)


def test_alpha_qe_hand_checked_weights():
    q = np.array([[1.0, 0.0]])
    cand = np.array([[[0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]]])
    # top-2 are (0.6, 0.8) with s=0.6 (weight 0.216) and (0, 1) with s=0 (weight 0).
    expect = np.array([1.0 + 0.216 * 0.6, 0.216 * 0.8])
    np.testing.assert_allclose(alpha_qe(q, cand, k=2, alpha=3)[0], expect / np.linalg.norm(expect))


def test_dba_excludes_self_and_sums_neighbours():
    g = _unit(np.random.default_rng(1).normal(size=(8, 4)))
    out = dba(g, k=2, alpha=1.0)
    for i in range(len(g)):
        sims = [(float(g[i] @ g[j]), j) for j in range(len(g)) if j != i]
        acc = g[i].copy()
        for s, j in sorted(sims, reverse=True)[:2]:
            acc += max(s, 0.0) * g[j]
        np.testing.assert_allclose(out[i], acc / np.linalg.norm(acc), atol=1e-12)


def _kr_loop(q, cand, k1, k2, lam):
    pts = np.vstack([q[None], cand])
    m = len(pts)
    d = np.array([[max(2 - 2 * float(a @ b), 0.0) for b in pts] for a in pts])
    knn = [list(np.argsort(d[i], kind="stable")) for i in range(m)]

    def recip(i, k):
        return {j for j in knn[i][: k + 1] if i in knn[j][: k + 1]}

    v = np.zeros((m, m))
    for p in range(m):
        r = recip(p, k1)
        star = set(r)
        for c in r:
            h = recip(c, int(round(k1 / 2)))
            if len(r & h) > 2 / 3 * len(h):
                star |= h
        for j in star:
            v[p, j] = np.exp(-d[p, j])
        v[p] /= v[p].sum()
    v = np.array([v[knn[p][:k2]].mean(axis=0) for p in range(m)])
    out = []
    for g in range(1, m):
        jac = 1 - np.minimum(v[0], v[g]).sum() / np.maximum(v[0], v[g]).sum()
        out.append((1 - lam) * jac + lam * d[0, g])
    return np.array(out)


@pytest.mark.parametrize("k1,k2,lam", [(4, 2, 0.3), (6, 1, 0.0), (3, 3, 1.0)])
def test_k_reciprocal_matches_loop(k1, k2, lam):
    queries, cand = _data(seed=2)
    got = k_reciprocal_distance(queries, cand, k1=k1, k2=k2, lam=lam)
    for qi in range(len(queries)):
        np.testing.assert_allclose(
            got[qi], _kr_loop(queries[qi], cand[qi], k1, k2, lam), atol=1e-12
        )


def test_k_reciprocal_lambda_one_is_original_distance():
    queries, cand = _data(seed=3)
    got = k_reciprocal_distance(queries, cand, k1=4, k2=2, lam=1.0)
    np.testing.assert_allclose(got, 2 - 2 * np.einsum("qd,qnd->qn", queries, cand), atol=1e-12)


def test_parse_rerank():
    assert parse_rerank("none").method == "none"
    assert parse_rerank("aqe:k=3,alpha=2").params == {"k": 3, "alpha": 2.0, "depth": 100}
    spec = parse_rerank("kreciprocal:lambda=0.5,depth=50")
    assert spec.params == {"k1": 20, "k2": 6, "lambda": 0.5, "depth": 50}
    assert parse_rerank(str(spec)) == spec  # the stored form reads back
    assert parse_rerank(None).method == "none"
    for bad in [
        "bogus",
        "aqe:k1=3",
        "aqe:k=x",
        "kreciprocal:lambda=2",
        "aqe:k",
        "aqe:alpha=nan",
        "kreciprocal:depth=5000",
    ]:
        with pytest.raises(ValueError) as err:
            parse_rerank(bad)
        assert "\n" not in str(err.value)


def test_rerank_aqe_fixes_a_hard_case():
    from nearsight.search.rerank import MatrixSource, rerank

    q = _unit(np.array([[1.0, 0.3, 0.0]]))
    # cos: row0 .97, row1 .94, row2 .85; after alpha-QE toward row0, row2 (.91) passes row1 (.90).
    rows = _unit(np.array([[1.0, 0.6, 0.0], [1.0, 0.0, 0.2], [0.8, 0.9, 0.0]]))
    got, _ = rerank(parse_rerank("aqe:k=1,alpha=1"), MatrixSource(rows), q, np.array([[0, 1, 2]]))
    assert got.tolist() == [[0, 2, 1]]
