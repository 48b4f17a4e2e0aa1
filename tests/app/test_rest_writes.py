"""Writes over REST on a real server: an item posted with its key and metadata is found by the
next search (the page's views see it too), a PATCH changes its metadata, a POST with a taken
key replaces, a DELETE removes it; writes are refused (403) unless the server allows them, a
file that is not an image gets 415, and no answer names a server folder."""

from __future__ import annotations

import io
import json
import shutil

import httpx
import numpy as np
import pytest
from helpers import running_page
from PIL import Image


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


KEY = "writes-test-key"


@pytest.fixture(scope="module")
def writable(shop, tmp_path_factory):
    folder = tmp_path_factory.mktemp("writes") / "catalog"
    shutil.copytree(shop["gallery"], folder)
    with running_page([folder], analyse=False, api_key=KEY, allow_writes=True) as (url, demo):
        yield url.rstrip("/"), demo, folder


def _new_image(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _call(method: str, url: str, **kwargs) -> httpx.Response:
    return httpx.request(method, url, headers={"X-API-Key": KEY}, timeout=60, **kwargs)


def _search_image(url: str, data: bytes, k: int = 3) -> list[dict]:
    answer = _call("POST", f"{url}/api/search", files={"image": ("q.png", data, "image/png")},
                   data={"k": str(k)})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return answer.json()["neighbours"]


def test_post_patch_replace_delete(writable, shop):
    url, demo, folder = writable
    before = len(demo.nearsight.view(None))
    image = _new_image(1)
    meta = {"name": "Neu", "shop": "Café", "price": 3.5}
    posted = _call("POST", f"{url}/api/items", files={"image": ("new.png", image, "image/png")},
                   data={"key": "NEW-1", "meta": json.dumps(meta)})  # fmt: skip
    assert posted.status_code == 201, posted.text
    item = posted.json()
    assert item["key"] == "NEW-1" and item["meta"]["price"] == 3.5 and item["replaced"] is None
    assert str(folder) not in posted.text  # no server folder in the answer
    found = _search_image(url, image)
    assert found[0]["key"] == "NEW-1" and found[0]["distance"] == 0.0  # the next search
    assert len(demo.nearsight.view(None)) == before + 1  # the page's view too
    shown = _call("GET", url + found[0]["image_url"])
    assert shown.status_code == 200 and shown.content == image

    patched = _call("PATCH", f"{url}/api/items/by-key", json={"key": "NEW-1",
                    "meta": {"price": 9.5, "shop": None}})  # fmt: skip
    assert patched.status_code == 200, patched.text
    row = _call("GET", f"{url}/api/items/by-key", params={"key": "NEW-1"}).json()
    assert row["meta"] == {"name": "Neu", "price": 9.5, "sku": "NEW-1"}
    assert patched.json()["replaced"] == item["id"]

    again = _call("POST", f"{url}/api/items", files={"image": ("b.png", _new_image(2), "image/png")},
                  data={"key": "NEW-1"})  # fmt: skip
    assert again.status_code == 201 and again.json()["replaced"] == patched.json()["id"]
    assert len(demo.nearsight.view(None)) == before + 1  # replaced, not added

    removed = _call("DELETE", f"{url}/api/items/by-key", params={"key": "NEW-1"})
    assert removed.status_code == 200, removed.text
    assert removed.json()["items"] == before
    assert all(hit["key"] != "NEW-1" for hit in _search_image(url, image, k=8))
    assert _call("GET", f"{url}/api/items/by-key", params={"key": "NEW-1"}).status_code == 404
    gone = _call("DELETE", f"{url}/api/items/by-key", params={"key": "NEW-1"})
    assert gone.status_code == 404 and set(gone.json()) == {"error"}


def test_bad_writes_are_one_line(writable):
    url, _, folder = writable
    for files, data, status in (
        ({"image": ("x.png", b"not an image", "image/png")}, {"key": "X"}, 415),
        ({"image": ("x.png", _new_image(3), "image/png")}, {"meta": "[1]"}, 422),
        ({"image": ("x.png", _new_image(3), "image/png")}, {"meta": '{"tags": [1]}'}, 422),
        # a list is a tag column's value (--list-column); this shop has none
        ({"image": ("x.png", _new_image(3), "image/png")}, {"meta": '{"shop": ["a"]}'}, 400),
        (None, {"key": "X"}, 422),
    ):
        answer = _call("POST", f"{url}/api/items", files=files, data=data)
        assert answer.status_code == status and set(answer.json()) == {"error"}, answer.text
        assert str(folder) not in answer.text and "\n" not in answer.json()["error"]
    assert httpx.post(f"{url}/api/items", timeout=30).status_code == 401  # behind the key
    bad = _call("PATCH", f"{url}/api/items/by-key", json={"key": "00001", "meta": [1]})
    assert bad.status_code == 422 and set(bad.json()) == {"error"}
    listed = _call("PATCH", f"{url}/api/items/by-key", json={"key": "00001",
                   "meta": {"shop": ["a", "b"]}})  # fmt: skip
    assert listed.status_code == 400 and "a list of values is for a tag column" in listed.text


def test_writes_are_off_unless_allowed(shop):
    with running_page([shop["gallery"]], analyse=False) as (url, _):
        url = url.rstrip("/")
        files = {"image": ("new.png", _new_image(4), "image/png")}
        for answer in (httpx.post(f"{url}/api/items", files=files, timeout=30),
                       httpx.delete(f"{url}/api/items/by-key", params={"key": "00001"},
                                    timeout=30)):  # fmt: skip
            assert answer.status_code == 403 and "--allow-writes" in answer.json()["error"]
