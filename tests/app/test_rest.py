"""The REST API (nearsight/app/rest/) on the real server that serves the page: search by file, by item
and by vector, filters inside FAISS, JSON errors with 4xx statuses, the upload limit, the API
key, OpenAPI, and the micro-batcher (nearsight/app/serve/batcher.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import HeldModel, assert_one_line_error, run, running_page
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from nearsight.app.serve.batcher import EmbedBatcher
from nearsight.app.server_app import served as served_app
from nearsight.index.gallery.core import Gallery


@pytest.fixture(scope="module")
def product(product_once):
    """The session's product gallery (helpers.make_product): this module only reads it."""
    return product_once


MAX_UPLOAD_MB = 0.25
KEY = "s3cret-key"


@contextlib.contextmanager
def _serve(gallery, **options):
    """(url without its trailing slash, app): the API is under f"{url}/api"."""
    with running_page([gallery], analyse=False, max_upload_mb=MAX_UPLOAD_MB, **options) as served:
        yield served[0].rstrip("/"), served[1]


@pytest.fixture(scope="module")
def api(product):  # noqa: F811
    with _serve(product["gallery"]) as served:
        yield served


def _search(url: str, image=None, **fields) -> httpx.Response:
    files = {"image": (image.name, image.read_bytes(), "image/png")} if image else None
    data = {key: str(value) for key, value in fields.items()}
    return httpx.post(f"{url}/api/search", files=files, data=data, timeout=60)


def reencoded(image: Path, folder: Path) -> Path:
    """A copy of ``image`` in ``folder`` with the same pixels in other bytes (not a gallery
    file)."""
    copy = folder / f"{image.parent.name}-{image.name}"  # images of two classes share names
    note = PngInfo()
    note.add_text("Comment", "a copy")  # a text chunk: other bytes, the same pixels
    Image.open(image).save(copy, pnginfo=note)
    return copy


def test_health_lists_the_galleries(api, product):  # noqa: F811
    url, _ = api
    answer = httpx.get(f"{url}/api/health", timeout=30)
    assert answer.status_code == 200
    (gallery,) = answer.json()["galleries"]
    assert gallery["items"] == 36 and gallery["dim"] == 16
    assert gallery["columns"] == {"price": "float", "shop": "str", "sku": "str"}


def test_search_by_file_returns_neighbours_with_meta(api, product):  # noqa: F811
    url, demo = api
    batcher = next(iter(served_app(demo).rest.state.rest.batchers.values()))
    calls = batcher.calls
    answer = _search(url, product["images"][3], k=5)
    assert batcher.calls == calls  # a gallery file is searched as its item: nothing embedded
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["k"] == 5 and len(body["neighbours"]) == 5
    first = body["neighbours"][0]
    assert first["distance"] == pytest.approx(0, abs=1e-3)
    assert first["meta"] == {"shop": "south", "price": 4.5, "sku": "0003"}
    assert str(product["images"][3]).endswith("/" + first["path"])  # below the items' folder


def test_filtered_search_returns_exactly_k_matching_items(api, product):  # noqa: F811
    url, _ = api
    k = 6
    answer = _search(url, product["images"][0], k=k, filter="shop=south; price>=10;price<40")
    assert answer.status_code == 200, answer.text
    rows = answer.json()["neighbours"]
    assert len(rows) == k
    assert all(r["meta"]["shop"] == "south" and 10 <= r["meta"]["price"] < 40 for r in rows)
    everything = _search(url, product["images"][0], k=36).json()["neighbours"]
    matching = [r["id"] for r in everything
                if r["meta"]["shop"] == "south" and 10 <= r["meta"]["price"] < 40]  # fmt: skip
    assert [r["id"] for r in rows] == matching[:k]


def test_search_by_item_and_by_vector(api, product):  # noqa: F811
    url, _ = api
    by_id = _search(url, id=4, k=3).json()["neighbours"]
    assert len(by_id) == 3 and by_id[0]["id"] == 4 and by_id[0]["distance"] < 1e-3
    with Gallery.open(product["gallery"]) as gallery:
        vector = (np.asarray(gallery.embeddings[4]) * 3).tolist()  # any length: a direction
    by_vector = _search(url, vector=json.dumps(vector), k=3).json()["neighbours"]
    assert [r["id"] for r in by_vector] == [r["id"] for r in by_id]


@pytest.mark.parametrize(
    "fields, status, fragment",
    [
        ({"vector": "[1, 2]"}, 422, "16 numbers"),
        ({"vector": "nope"}, 422, "JSON list"),
        ({"id": 999}, 404, "no item with id 999"),
        ({"id": 1, "k": 0}, 422, "k"),
        ({"id": 1, "filter": "price>=cheap"}, 400, "needs a number"),
        ({"id": 1, "gallery": "other"}, 404, "no gallery named"),
        ({}, 422, "exactly one of"),
    ],
)
def test_bad_requests_get_a_one_line_json_error(api, fields, status, fragment):
    url, _ = api
    answer = _search(url, **fields)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert fragment in error and "\n" not in error and "Traceback" not in error


def test_a_non_image_is_refused_with_415(api, tmp_path):
    url, _ = api
    fake = tmp_path / "notes.png"
    fake.write_text("this is not an image\n")
    answer = _search(url, fake, k=3)
    assert answer.status_code == 415
    assert "notes.png" in answer.json()["error"]
    assert list(answer.json()) == ["error"]


def test_an_oversized_upload_is_refused_with_413(api, tmp_path):
    url, _ = api
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG" + b"\0" * int(MAX_UPLOAD_MB * 1024 * 1024 * 2))
    answer = _search(url, big, k=3)
    assert answer.status_code == 413 and "limit" in answer.json()["error"]


def test_items_route_and_openapi(api):
    url, _ = api
    item = httpx.get(f"{url}/api/items/7", timeout=30).json()
    assert item["id"] == 7 and set(item["meta"]) == {"shop", "price", "sku"} and "path" in item
    missing = httpx.get(f"{url}/api/items/999", timeout=30)
    assert missing.status_code == 404 and "999" in missing.json()["error"]
    schema = httpx.get(f"{url}/api/openapi.json", timeout=30).json()
    assert {"/search", "/items/{item_id}", "/health"} <= set(schema["paths"])
    assert httpx.get(f"{url}/api/docs", timeout=30).status_code == 200
    assert httpx.get(f"{url}/", timeout=30).status_code == 200  # the page is still there


def test_concurrent_requests_all_answered_correctly(api, product, tmp_path):  # noqa: F811
    url, demo = api
    batcher = next(iter(served_app(demo).rest.state.rest.batchers.values()))
    calls, embedded = batcher.calls, batcher.embedded
    images = product["images"][:8]
    with ThreadPoolExecutor(8) as pool:  # new bytes, same pixels: embedded, not recognised
        answers = list(
            pool.map(lambda image: _search(url, reencoded(image, tmp_path), k=1), images)
        )
    for image, answer in zip(images, answers, strict=True):
        assert answer.status_code == 200, answer.text
        assert str(image).endswith("/" + answer.json()["neighbours"][0]["path"])
    assert batcher.embedded - embedded == 8 and 1 <= batcher.calls - calls <= 8


def test_batcher_embeds_waiting_requests_in_one_call():
    model = HeldModel()
    batcher = EmbedBatcher(model.embed, max_batch=16)
    try:
        first = batcher.submit(np.ones(3, np.float32))
        assert model.started.wait(10)  # the model is busy with the first request ...
        rest = [batcher.submit(np.full(3, i, np.float32)) for i in range(7)]
        time.sleep(0.05)
        model.release.set()  # ... the seven that arrived meanwhile share the next call
        assert first.result(10).tolist() == [2, 2, 2]
        assert [f.result(10)[0] for f in rest] == [2.0 * i for i in range(7)]
        assert model.sizes == [1, 7]
    finally:
        batcher.close()


def test_a_lone_upload_is_embedded_once_and_searched(api, product, tmp_path):  # noqa: F811
    url, demo = api
    batcher = next(iter(served_app(demo).rest.state.rest.batchers.values()))
    calls, embedded = batcher.calls, batcher.embedded
    answer = _search(url, reencoded(product["images"][5], tmp_path), k=3)
    assert answer.status_code == 200, answer.text
    assert (batcher.calls - calls, batcher.embedded - embedded) == (1, 1)
    assert str(product["images"][5]).endswith("/" + answer.json()["neighbours"][0]["path"])


def test_batcher_embeds_a_lone_input_in_the_callers_thread():
    threads = []

    def embed(batch):
        threads.append(threading.current_thread())
        return batch * 2.0

    batcher = EmbedBatcher(embed)
    try:
        vector = batcher.embed_now(np.ones(3, np.float32))
        assert vector is not None and vector.tolist() == [2, 2, 2] and vector.dtype == np.float32
        assert threads == [threading.current_thread()]
        assert (batcher.calls, batcher.embedded) == (1, 1)
    finally:
        batcher.close()


def test_embed_now_gives_way_to_waiting_inputs_which_stay_one_batch():
    model = HeldModel()
    batcher = EmbedBatcher(model.embed, max_batch=16)
    try:
        with ThreadPoolExecutor(1) as pool:
            inline = pool.submit(batcher.embed_now, np.ones(3, np.float32))
            assert model.started.wait(10)  # the model is busy with a caller's own input ...
            assert batcher.embed_now(np.ones(3, np.float32)) is None  # ... so this one queues
            queued = [batcher.submit(np.full(3, i, np.float32)) for i in range(4)]
            time.sleep(0.05)
            assert batcher.embed_now(np.ones(3, np.float32)) is None  # inputs wait: they go first
            model.release.set()
            assert inline.result(10).tolist() == [2, 2, 2]
        assert [f.result(10)[0] for f in queued] == [2.0 * i for i in range(4)]
        assert model.sizes == [1, 4]  # the four that waited for the model shared its next call
        assert batcher.embed_now(np.ones(3, np.float32)) is not None
        assert model.sizes == [1, 4, 1]
    finally:
        batcher.close()


def test_batcher_passes_a_model_error_to_every_waiting_request():
    def embed(batch):
        raise RuntimeError("model failed")

    batcher = EmbedBatcher(embed)
    try:
        with pytest.raises(RuntimeError, match="model failed"):
            batcher.submit(np.ones(3, np.float32)).result(10)
    finally:
        batcher.close()


def test_api_key_is_required_when_set(product):  # noqa: F811
    with _serve(product["gallery"], api_key=KEY) as (url, _):
        image = product["images"][2]
        refused = _search(url, image, k=2)
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
        wrong = httpx.post(f"{url}/api/search", data={"id": 1}, headers={"X-API-Key": "x"})
        assert wrong.status_code == 401
        assert httpx.get(f"{url}/api/items/1", timeout=30).status_code == 401
        files = {"image": (image.name, image.read_bytes(), "image/png")}
        allowed = httpx.post(f"{url}/api/search", files=files, data={"k": "2"},
                             headers={"X-API-Key": KEY}, timeout=60)  # fmt: skip
        assert allowed.status_code == 200 and len(allowed.json()["neighbours"]) == 2
        bearer = httpx.get(f"{url}/api/items/1", headers={"Authorization": f"Bearer {KEY}"})
        assert bearer.status_code == 200
        assert httpx.get(f"{url}/api/health", timeout=30).status_code == 200


def test_serving_beyond_localhost_needs_a_key(capsys, product, monkeypatch):  # noqa: F811
    monkeypatch.delenv("NEARSIGHT_API_KEY", raising=False)
    code, _, err = run(capsys, "serve", "--gallery", product["gallery"], "--host", "0.0.0.0")
    assert_one_line_error(code, err, "--api-key", "NEARSIGHT_API_KEY")


def test_api_key_comes_from_the_flag_or_the_environment(monkeypatch):
    from nearsight.app.serve.run import resolve_api_key

    monkeypatch.setenv("NEARSIGHT_API_KEY", "from-env-16-chars")
    assert resolve_api_key(None, None, "0.0.0.0") == "from-env-16-chars"
    assert resolve_api_key("flag-of-16-chars", None, "0.0.0.0") == "flag-of-16-chars"
    monkeypatch.delenv("NEARSIGHT_API_KEY")
    for host in ("127.0.0.1", "::1", "localhost"):
        assert resolve_api_key(None, None, host) is None


@pytest.mark.slow
def test_route_notes_reach_the_rest_answer(onnx_gallery, tmp_path):
    """What the search route says of its answer reaches REST's ``notes``: a filtered search of
    a PQ gallery kept without its exact vectors cannot promise its recall target, and says so
    (the index's note, nearsight/index/ann/filtered.py); a filter value no item holds names the
    closest values; a plain search has no note."""
    from nearsight.index.ann.filtered import CODES_ONLY_NOTE
    from nearsight.index.gallery.build import model_meta
    from nearsight.index.gallery.write import write_gallery
    from nearsight.models.loading import load_embedder

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    items = [{"path": f"/s/{i}.jpg", "label": i % 3, "meta": {"shop": ("north", "south")[i % 2]}}
             for i in range(3000)]  # fmt: skip
    embedder = load_embedder(onnx_gallery.model)
    folder = write_gallery(tmp_path / "pq", vectors, items, model_sha256=embedder.model_sha256,
                           meta=model_meta(embedder, onnx_gallery.model), index_type="ivfpq",
                           embeddings="drop")  # fmt: skip
    with _serve(folder) as (url, _):
        coded = httpx.post(f"{url}/api/search", json={"vector": vectors[5].tolist(), "k": 5,
                                                      "filter": "label=1"}, timeout=60)  # fmt: skip
        missing = httpx.post(f"{url}/api/search", data={"id": "4", "filter": "shop=nort"},
                             timeout=60)  # fmt: skip
        plain = httpx.post(f"{url}/api/search", json={"id": 4, "k": 5}, timeout=60)
    assert coded.status_code == 200, coded.text
    assert coded.json()["notes"] == [CODES_ONLY_NOTE]
    assert [n["label"] for n in coded.json()["neighbours"]] == [1] * 5
    assert missing.status_code == 200 and missing.json()["neighbours"] == []
    assert missing.json()["notes"] == [
        "shop=nort: no item has shop 'nort'; the closest values it holds: 'north'"
    ]
    assert plain.json()["notes"] == [] and len(plain.json()["neighbours"]) == 5
