"""One search request (nearsight.search.request): the Python API, the CLI, REST and the page
turn the same user input into requests that check to the same terms and get the same answer
through ``Searcher.run``; a pairwise re-ranker is opened once per gallery, however many
searches run, and again only when the gallery changes."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from helpers import run

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.search import searcher as searcher_module
from nearsight.search.request import (
    ImageQuery,
    ItemQuery,
    KeyQuery,
    SearchRequest,
    VectorQuery,
)
from nearsight.search.rerank.spec import parse_rerank

K = 4
FILTER = "label>=1"
RERANK = "dba+aqe:k=5,alpha=3"  # what the page's toggle turns on for a gallery without one


@pytest.fixture()
def answered(monkeypatch):
    """Every (checked request, answer) that ``Searcher.run`` gives, in order."""
    seen: list = []
    real = searcher_module.answer

    def recording(searcher, checked):
        found = real(searcher, checked)
        seen.append((checked, found))
        return found

    monkeypatch.setattr(searcher_module, "answer", recording)
    return seen


def test_the_four_faces_ask_the_same_search(tiny, tiny_page, capsys, answered):
    image = str(tiny.items[7]["path"])
    with nearsight.open_gallery(tiny.gallery, device="cpu") as gallery:
        gallery.search(image, K, filters=FILTER, rerank=RERANK)
    flags = ["--k", K, "--filter", FILTER, "--rerank", RERANK, "--json"]
    code, _, err = run(capsys, "search", "--gallery", tiny.gallery, image, *flags)
    assert code == 0, err
    with open(image, "rb") as handle:
        files = {"image": ("q.png", handle.read(), "image/png")}
    fields = {"k": str(K), "filter": FILTER, "rerank": RERANK}
    url = f"{tiny_page[0].rstrip('/')}/api/search"
    answer = httpx.post(url, files=files, data=fields, timeout=60)
    assert answer.status_code == 200, answer.text
    page = tiny_page[1].nearsight
    page.upload_grid("gallery", image, K, "-1", FILTER, True)
    assert len(answered) == 4  # Python, CLI, REST, page: each one request, run once
    first, found = answered[0]
    assert first.k == K and first.rerank == parse_rerank(RERANK) and len(first.conditions) == 1
    assert found.query_item == 7 and len(found) == K  # its own file: searched as item 7
    for checked, other in answered[1:]:
        assert checked.k == first.k and checked.page == first.page
        assert checked.conditions == first.conditions
        assert str(checked.rerank) == str(first.rerank) and checked.label == first.label
        assert [hit.id for hit in other] == [hit.id for hit in found]
        assert [hit.distance for hit in other] == pytest.approx(
            [hit.distance for hit in found], abs=1e-5
        )
        assert other.notes == found.notes and other.query_item == found.query_item
    assert [row["id"] for row in answer.json()["neighbours"]] == [hit.id for hit in found]


def test_an_item_query_by_id_and_by_key_is_one_request(tiny, answered):
    with nearsight.open_gallery(tiny.gallery, device="cpu") as gallery:
        by_keywords = gallery.search_item(3, K, filters=FILTER, offset=1, leave_out=True)
        request = SearchRequest(ItemQuery(3), K, FILTER, offset=1, leave_out=True)
        by_request = gallery.run(request)
        with pytest.raises(NearsightError, match="no key column"):
            gallery.run(SearchRequest(KeyQuery("x")))
    (keywords, _), (direct, _) = answered
    assert keywords.request == request == direct.request  # the keywords build that request
    assert [hit.id for hit in by_keywords] == [hit.id for hit in by_request]
    assert 3 not in [hit.id for hit in by_request] and by_request.query_item == 3
    assert [hit.rank for hit in by_request] == list(range(2, K + 2))  # the second page


def test_requests_compare_by_what_they_ask():
    vector = np.arange(4, dtype=np.float32)
    assert SearchRequest(VectorQuery(vector)) == SearchRequest(VectorQuery(vector.tolist()))
    assert SearchRequest(VectorQuery(vector)) != SearchRequest(VectorQuery(vector + 1))
    assert SearchRequest(ImageQuery("a.png"), 5) != SearchRequest(ImageQuery("a.png"), 6)
    with pytest.raises(AttributeError):
        SearchRequest(ItemQuery(1)).k = 3  # type: ignore[misc]  # frozen


def test_a_bad_request_is_one_line_before_any_image_is_read(tiny):
    with nearsight.open_gallery(tiny.gallery, device="cpu") as gallery:
        missing = ImageQuery(tiny.root / "no-such-image.png")
        for request, words in [
            (SearchRequest(missing, 0), "k must be a whole number"),
            (SearchRequest(missing, filters="price>>1"), "a typo"),
            (SearchRequest(missing, rerank="nope"), "unknown rerank method"),
            (SearchRequest(missing, group_by="nope"), "no such column"),
            (SearchRequest(ItemQuery(10_000)), "no item with id 10000"),
            (SearchRequest(VectorQuery([1.0, 2.0])), "16 numbers"),
            ("k=5", "a search request is a SearchRequest"),
        ]:
            with pytest.raises(NearsightError, match=words):
                gallery.run(request)  # type: ignore[arg-type]


def test_a_pairwise_reranker_is_opened_once_per_gallery(staged, monkeypatch):
    from nearsight.search.rerank import pairwise, stage_store

    pairwise._cache.clear()  # another test's searches opened it: count this one's
    loads: list[str] = []
    stores: list[str] = []
    load, open_store = pairwise.load_reranker, stage_store.open_stage_store
    monkeypatch.setattr(pairwise, "load_reranker", lambda path: loads.append(path) or load(path))
    monkeypatch.setattr(stage_store, "open_stage_store",
                        lambda folder: stores.append(folder) or open_store(folder))  # fmt: skip
    with nearsight.open_gallery(staged["gallery"]) as searcher:
        first = [hit.id for hit in searcher.search(staged["query"], 6, rerank=staged["spec"])]
        for query in staged["queries"][1:4]:
            searcher.search(query, 6, rerank=staged["spec"])
        searcher.search_item(0, 6, rerank=staged["spec"])
        searcher.run(SearchRequest(ItemQuery(1), 6, rerank=staged["spec"], leave_out=True))
        assert len(loads) == 1 and len(stores) == 1, (loads, stores)
        assert [hit.id for hit in searcher.search(staged["query"], 6, rerank=staged["spec"])] == (
            first
        )
        searcher.gallery.reload()  # the gallery read anew: its re-rankers are built again
        searcher.search(staged["query"], 6, rerank=staged["spec"])
        assert len(loads) == 2
    json.dumps(first)  # plain ids
