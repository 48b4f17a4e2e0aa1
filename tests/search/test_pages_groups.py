"""Pages (``offset``) and grouped searches (``group_by``), on every index type, with filters and
re-ranking, against a float64 brute force and against one long search.

- Pages: the pages of k concatenate to the search of (pages x k), ids and distances, whatever
  the index type, the filter or the re-ranking; on flat that long search is the brute force's.
- Groups: a grouped search equals grouping the brute-force ranking of the allowed items (flat),
  or the route's own ranking of every allowed item (the approximate types: the same groups
  their ungrouped search gives); its pages concatenate too.
- The CLI's ``--offset`` / ``--group-by`` and the Python API give one answer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import PHOTO_SHOP_DIM, PHOTO_SHOP_INDEX_TYPES, PHOTO_SHOP_ITEMS, make_photo_shop

from nearsight.app.cli import main
from nearsight.core.errors import NearsightError
from nearsight.search import route
from nearsight.search.searcher import open_gallery

INDEX_TYPES = PHOTO_SHOP_INDEX_TYPES
ITEMS, DIM = PHOTO_SHOP_ITEMS, PHOTO_SHOP_DIM
RERANK = "dba+aqe:k=2,alpha=3,depth=30"
FILTERS = ([], ["shop=north"], ["price>=5", "shop!=süd"])


@pytest.fixture(scope="module")
def catalog(onnx_gallery, tmp_path_factory) -> dict:
    """:func:`helpers.make_photo_shop`: every index type."""
    return make_photo_shop(tmp_path_factory.mktemp("pages"), onnx_gallery.model)


def _allowed(rows: list[dict], filters: list[str]) -> np.ndarray:
    keep = np.ones(len(rows), dtype=bool)
    for text in filters:
        if text == "shop=north":
            keep &= np.array([r["shop"] == "north" for r in rows])
        elif text == "price>=5":
            keep &= np.array([float(r["price"]) >= 5 for r in rows])
        elif text == "shop!=süd":
            keep &= np.array([r["shop"] != "süd" for r in rows])
        else:
            raise AssertionError(text)
    return np.flatnonzero(keep)


def _brute(vectors: np.ndarray, query: np.ndarray, allowed: np.ndarray) -> list[int]:
    """The allowed ids by exact distance (ties by id)."""
    distances = np.linalg.norm(vectors[allowed].astype(np.float64) - query.astype(np.float64),
                               axis=1)  # fmt: skip
    return [int(allowed[o]) for o in np.lexsort((allowed, distances))]


def _group(ranking: list[int], rows: list[dict], k: int, size: int) -> list[tuple[str, list[int]]]:
    groups: dict[str, list[int]] = {}
    for item in ranking:
        if rows[item]["sku"]:
            groups.setdefault(rows[item]["sku"], []).append(item)
    return [(value, hits[:size]) for value, hits in list(groups.items())[:k]]


def _queries(vectors: np.ndarray) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    out = []
    for _ in range(4):
        vector = vectors[rng.integers(ITEMS)] + 0.3 * rng.normal(size=DIM)
        out.append((vector / np.linalg.norm(vector)).astype(np.float32))
    return out


@pytest.mark.parametrize("index_type", INDEX_TYPES)
def test_pages_concatenate_to_the_long_search(catalog, index_type):
    vectors, rows = catalog["vectors"], catalog["rows"]
    with open_gallery(catalog["galleries"][index_type]) as gallery:
        for filters in FILTERS:
            allowed = _allowed(rows, filters)
            for rerank in ("none", RERANK):
                for query in _queries(vectors):
                    for k in (3, 7):
                        pages = [gallery.search_vector(query, k, filters=filters, rerank=rerank,
                                                       offset=n * k) for n in range(5)]  # fmt: skip
                        long = gallery.search_vector(query, 5 * k, filters=filters, rerank=rerank)
                        joined = [hit for page in pages for hit in page]
                        assert [h.id for h in joined] == [h.id for h in long], (filters, rerank, k)
                        assert [h.rank for h in joined] == list(range(1, len(long) + 1))
                        assert [h.distance for h in joined] == [h.distance for h in long]
                        assert len(long) == min(5 * k, len(allowed))
                        if index_type == "flat" and rerank == "none":
                            want = _brute(vectors, query, allowed)[: 5 * k]
                            assert [h.id for h in long] == want
                # an item query: itself first on page 0, never again after
                first = gallery.search_item(int(allowed[0]), 4, filters=filters, rerank=rerank)
                second = gallery.search_item(int(allowed[0]), 4, filters=filters, rerank=rerank,
                                             offset=4)  # fmt: skip
                long = gallery.search_item(int(allowed[0]), 8, filters=filters, rerank=rerank)
                assert [h.id for h in [*first, *second]] == [h.id for h in long]
                assert first[0].id == allowed[0] and first[0].distance == 0.0


@pytest.mark.parametrize("index_type", INDEX_TYPES)
def test_groups_equal_grouping_the_ranking(catalog, index_type):
    vectors, rows = catalog["vectors"], catalog["rows"]
    agree = []
    with open_gallery(catalog["galleries"][index_type]) as gallery:
        for filters in FILTERS:
            allowed = _allowed(rows, filters)
            for query in _queries(vectors):
                exact = _brute(vectors, query, allowed)
                if index_type in ("flat", "hnsw"):  # hnsw: compared with the brute force below
                    ranking = exact
                else:  # ivf and pq: the route's own ranking of every allowed item
                    ranked = route.ranking(gallery.gallery, query[None, :], len(allowed),
                                           allowed=gallery.filtered(filters).allowed,
                                           rerank=gallery.resolve_rerank("none"))  # fmt: skip
                    ranking = ranked[0][0]
                for k, size in ((5, 1), (4, 3), (6, 8)):
                    found = gallery.search_vector(query, k, filters=filters, rerank="none",
                                                  group_by="sku", group_size=size)  # fmt: skip
                    want = _group(ranking, rows, k, size)
                    got = [(g.value, [h.id for h in g.neighbours]) for g in found.groups]
                    assert [h.id for h in found] == [i for _, hits in got for i in hits]
                    if index_type == "hnsw":  # approximate: the same groups, mostly
                        agree.append(len({v for v, _ in got} & {v for v, _ in want}) / len(want))
                    else:
                        assert got == want, (index_type, filters, k, size)
                    for group in found.groups:
                        holding = [i for i in allowed if rows[i]["sku"] == group.value]
                        assert group.count == len(holding)
                        ids = [h.id for h in group.neighbours]
                        assert set(ids) <= set(holding) and len(ids) == min(size, len(holding))
                        assert [h.rank for h in group.neighbours] == sorted(
                            h.rank for h in group.neighbours
                        )
                    best = [g.neighbours[0].distance for g in found.groups]
                    assert best == sorted(best)
                # pages of groups concatenate
                pages = [gallery.search_vector(query, 3, filters=filters, rerank=RERANK,
                                               group_by="sku", group_size=2, offset=3 * n)
                         for n in range(3)]  # fmt: skip
                long = gallery.search_vector(query, 9, filters=filters, rerank=RERANK,
                                             group_by="sku", group_size=2)  # fmt: skip
                assert [g for p in pages for g in p.groups] == long.groups
    if agree:
        assert np.mean(agree) >= 0.9, agree


def test_a_bad_page_is_one_line(catalog):
    with open_gallery(catalog["galleries"]["flat"]) as gallery:
        query = catalog["vectors"][0]
        for kwargs, words in (
            ({"offset": -1}, "offset must be a whole number"),
            ({"offset": 1.5}, "offset must be a whole number"),
            ({"group_by": "skus"}, "did you mean 'sku'"),
            ({"group_by": "sku", "group_size": 0}, "group_size must be"),
            ({"group_size": 2}, "group_size needs group_by"),
        ):
            with pytest.raises(NearsightError, match=words):
                gallery.search_vector(query, 4, **kwargs)
        assert gallery.group_column == "sku"  # recorded by --group-column


def test_the_cli_pages_and_groups_as_python(catalog, capsys):
    folder = catalog["galleries"]["hnsw"]
    query = catalog["root"] / "query.npy"
    np.save(query, catalog["vectors"][11])
    base = ["search", "--gallery", str(folder), "--vector", str(query), "--k", "4", "--json",
            "--filter", "price>=5"]  # fmt: skip
    assert main([*base, "--offset", "4"]) == 0
    paged = json.loads(capsys.readouterr().out)
    assert main([*base, "--group-by", "sku", "--group-size", "2", "--offset", "1"]) == 0
    grouped = json.loads(capsys.readouterr().out)
    with open_gallery(folder) as gallery:
        want = gallery.search_vector(catalog["vectors"][11], 4, filters=["price>=5"], offset=4)
        groups = gallery.search_vector(catalog["vectors"][11], 4, filters=["price>=5"], offset=1,
                                       group_by="sku", group_size=2).groups  # fmt: skip
    assert paged == [hit.as_json() for hit in want] and paged[0]["rank"] == 5
    assert grouped == [group.as_json() for group in groups]
    assert main([*base, "--offset", "-2"]) == 2
    assert "offset" in capsys.readouterr().err
    assert main([*base, "--group-by", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_grouped_search_with_no_group_says_so(catalog):
    with open_gallery(catalog["galleries"]["flat"]) as gallery:
        query = catalog["vectors"][0]
        empty = gallery.search_vector(query, 3, filters="price>100", group_by="sku")
        assert empty.groups == [] and list(empty) == []
        assert gallery.search_vector(query, 3).groups is None
        far = gallery.search_vector(query, 3, group_by="sku", offset=10_000)
        assert far.groups == []
