"""REST's pages, groups and images on a real server: ``offset``, ``group_by`` / ``group_size``
answer as the Python API does (and validate against the OpenAPI models); each neighbour's
``image_url`` serves its image (or a thumbnail) behind the key, naming no server path."""

from __future__ import annotations

import io

import httpx
import pytest
from helpers import make_photo_shop, running_page
from PIL import Image

from nearsight.app.rest.models import SearchAnswer
from nearsight.search.searcher import open_gallery

KEY = "s3cret-key-for-tests"


@pytest.fixture(scope="module")
def served(onnx_gallery, tmp_path_factory):
    shop = make_photo_shop(tmp_path_factory.mktemp("rest-pages"), onnx_gallery.model, ("hnsw",))
    galleries = [shop["galleries"]["hnsw"], onnx_gallery.gallery]
    with running_page(galleries, analyse=False, api_key=KEY) as (url, demo):
        names = {view.path: name for name, view in demo.nearsight.views.items()}
        yield {"url": url.rstrip("/"), "shop": shop, "names": names, "images": onnx_gallery}


def _post(served, **body) -> httpx.Response:
    return httpx.post(f"{served['url']}/api/search", json=body, headers={"X-API-Key": KEY},
                      timeout=60)  # fmt: skip


def test_pages_and_groups_answer_as_python(served):
    shop = served["shop"]
    folder = shop["galleries"]["hnsw"]
    name = served["names"][folder]
    vector = shop["vectors"][17].tolist()
    with open_gallery(folder) as gallery:
        for asked in ({"offset": 6}, {"group_by": "sku", "group_size": 3, "offset": 2},
                      {"group_by": "sku"}):  # fmt: skip
            answer = _post(served, vector=vector, k=4, gallery=name, filter="price>=3", **asked)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            SearchAnswer.model_validate(body)
            want = gallery.search_vector(vector, 4, filters="price>=3", **asked)
            assert [n["id"] for n in body["neighbours"]] == [n.id for n in want]
            assert [n["rank"] for n in body["neighbours"]] == [n.rank for n in want]
            assert body["offset"] == asked.get("offset", 0)
            if "group_by" in asked:
                assert body["group_by"] == "sku"
                assert [(g["value"], g["count"], [n["id"] for n in g["neighbours"]])
                        for g in body["groups"]] == [
                    (g.value, g.count, [n.id for n in g.neighbours]) for g in want.groups
                ]  # fmt: skip
            else:
                assert body["groups"] is None and body["neighbours"][0]["rank"] == 7
        # a form asks the same
        form = httpx.post(f"{served['url']}/api/search", headers={"X-API-Key": KEY}, timeout=60,
                          data={"id": "3", "k": "3", "offset": "3", "gallery": name})  # fmt: skip
        assert form.status_code == 200, form.text
        assert [n["id"] for n in form.json()["neighbours"]] == [
            n.id for n in gallery.search_item(3, 3, offset=3)
        ]
    for bad, status in (({"offset": -1}, 422), ({"group_by": "nope"}, 400),
                        ({"group_size": 0, "group_by": "sku"}, 422),
                        ({"group_size": 2}, 400)):  # fmt: skip
        answer = _post(served, vector=vector, k=4, gallery=name, **bad)
        assert answer.status_code == status and set(answer.json()) == {"error"}, answer.text


def test_image_urls_serve_the_items_images(served):
    images = served["images"]
    name = served["names"][images.gallery]
    answer = _post(served, id=2, k=3, gallery=name)
    assert answer.status_code == 200, answer.text
    with open_gallery(images.gallery) as gallery:
        rows = {row["id"]: row for row in gallery.gallery.all_items()}
    for hit in answer.json()["neighbours"]:
        url = served["url"] + hit["image_url"]
        assert str(images.data) not in hit["image_url"]
        assert httpx.get(url, timeout=30).status_code == 401  # behind the key
        whole = httpx.get(url, headers={"X-API-Key": KEY}, timeout=30)
        assert whole.status_code == 200 and whole.headers["content-type"] == "image/png"
        with open(rows[hit["id"]]["path"], "rb") as handle:
            assert whole.content == handle.read()
        small = httpx.get(url + "&size=20", headers={"X-API-Key": KEY}, timeout=30)
        assert small.status_code == 200 and small.headers["content-type"] == "image/jpeg"
        assert max(Image.open(io.BytesIO(small.content)).size) <= 20
    shop = served["shop"]["galleries"]["hnsw"]
    missing = httpx.get(f"{served['url']}/api/items/1/image?gallery={served['names'][shop]}",
                        headers={"X-API-Key": KEY}, timeout=30)  # fmt: skip
    assert missing.status_code == 404 and "/shop" not in missing.text  # no server path
    for tail in ("items/999/image", "items/1/image?size=5", "items/x/image"):
        bad = httpx.get(f"{served['url']}/api/{tail}", headers={"X-API-Key": KEY}, timeout=30)
        assert bad.status_code in (404, 422) and set(bad.json()) == {"error"}, bad.text
    spec = httpx.get(f"{served['url']}/api/openapi.json", headers={"X-API-Key": KEY},
                     timeout=30).json()  # fmt: skip
    assert "/items/{item_id}/image" in spec["paths"]


def test_only_image_files_are_sent_as_images():
    from nearsight.app.rest.routes.images import image_kind

    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, format="PNG")
    assert image_kind(png.getvalue()) == ("image/png", ".png")
    assert image_kind(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == ("image/webp", ".webp")
    for other in (b"", b"root:x:0:0:root:/root:/bin/bash\n", b"%PDF-1.7"):
        assert image_kind(other) is None
