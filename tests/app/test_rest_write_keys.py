"""Read-only keys on a real server: a ``NAME KEY read`` line of ``--keys-file`` searches and reads
(200) but each REST write refuses it with 403 and one JSON line, leaving the gallery as it was;
a ``write`` key, and a key without the third word (a keys file of before), write; with no
``--allow-writes`` no key writes."""

from __future__ import annotations

import io
import json
import shutil

import httpx
import numpy as np
import pytest
from helpers import running_page
from PIL import Image

from nearsight.app.serve.auth import ApiKeys, parse_keys_file
from nearsight.core.errors import NearsightError


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


WRITER, READER, OLD_STYLE = "writer-key-0123456789", "reader-key-0123456789", "older-key-0123456789"
KEYS = f"# the shop\nadmin {WRITER} write\nfront {READER} read\nbefore {OLD_STYLE}\n"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(KEYS)
    return path


@pytest.fixture(scope="module")
def served(shop, keys_file, tmp_path_factory):
    folder = tmp_path_factory.mktemp("write-keys") / "catalog"
    shutil.copytree(shop["gallery"], folder)
    options = {"keys_file": keys_file, "allow_writes": True}
    with running_page([folder], analyse=False, **options) as (url, demo):
        yield url.rstrip("/"), demo


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _writes(url: str, key: str, seed: int) -> list[httpx.Response]:
    """The three writes, with ``key``: POST, PATCH, DELETE of one new item."""
    headers = {"X-API-Key": key}
    call = httpx.request
    sku = f"K-{seed}"
    files = {"image": ("new.png", _png(seed), "image/png")}
    data = {"key": sku, "meta": json.dumps({"name": "Neu", "price": 1.5})}
    posted = call("POST", f"{url}/api/items", files=files, data=data, headers=headers, timeout=60)
    patched = call("PATCH", f"{url}/api/items/by-key", headers=headers, timeout=60,
                   json={"key": sku, "meta": {"price": 2.5}})  # fmt: skip
    removed = call("DELETE", f"{url}/api/items/by-key", params={"key": sku}, headers=headers,
                   timeout=60)  # fmt: skip
    return [posted, patched, removed]


def _search(url: str, key: str, image: bytes) -> httpx.Response:
    return httpx.post(f"{url}/api/search", files={"image": ("q.png", image, "image/png")},
                      data={"k": "3"}, headers={"X-API-Key": key}, timeout=60)  # fmt: skip


def test_a_read_key_reads_but_every_write_is_refused(served, shop):
    url, demo = served
    before = len(demo.nearsight.view(None))
    for answer in _writes(url, READER, 1):
        assert answer.status_code == 403, answer.text
        assert set(answer.json()) == {"error"}
        assert "'front' may only read" in answer.json()["error"]
        assert "\n" not in answer.json()["error"]
    assert len(demo.nearsight.view(None)) == before
    found = _search(url, READER, shop["images"][3].read_bytes())
    assert found.status_code == 200 and found.json()["neighbours"][0]["distance"] == 0.0
    item = httpx.get(f"{url}/api/items/by-key", params={"key": "00003"},
                     headers={"X-API-Key": READER}, timeout=30)  # fmt: skip
    assert item.status_code == 200 and item.json()["key"] == "00003"
    facets = httpx.get(f"{url}/api/facets", headers={"X-API-Key": READER}, timeout=30)
    assert facets.status_code == 200


@pytest.mark.parametrize("key", [WRITER, OLD_STYLE], ids=["write", "no-third-word"])
def test_a_write_key_writes(served, key):
    url, demo = served
    before = len(demo.nearsight.view(None))
    posted, patched, removed = _writes(url, key, 3 if key == WRITER else 4)
    assert posted.status_code == 201, posted.text
    assert patched.status_code == 200 and patched.json()["meta"]["price"] == 2.5, patched.text
    assert removed.status_code == 200 and removed.json()["items"] == before, removed.text
    assert len(demo.nearsight.view(None)) == before


def test_without_allow_writes_no_key_writes(shop, keys_file):
    with running_page([shop["gallery"]], analyse=False, keys_file=keys_file) as (url, demo):
        url = url.rstrip("/")
        before = len(demo.nearsight.view(None))
        for key in (WRITER, READER):
            for answer in _writes(url, key, 5):
                assert answer.status_code == 403 and "--allow-writes" in answer.json()["error"]
        assert _search(url, READER, _png(6)).status_code == 200
        assert len(demo.nearsight.view(None)) == before


def test_a_keys_files_third_word_is_read_or_write(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    keys, read_only = parse_keys_file(path)
    assert keys == {"admin": WRITER, "front": READER, "before": OLD_STYLE}
    assert read_only == {"front"}
    served = ApiKeys.of("lone-key-0123456789", path, "0.0.0.0")
    assert served is not None
    assert [served.may_write(n) for n in ("key", "admin", "front", "before", "nobody", None)] == [
        True, True, False, True, False, False,
    ]  # fmt: skip
    assert served.access("front") == "read" and served.access("admin") == "write"
    # what a key may do is part of the sessions' secret: a change ends every session
    path.write_text(KEYS.replace(" read", " write"))
    changed = ApiKeys.of(None, path)
    path.write_text(KEYS)
    assert changed is not None and changed.secret != ApiKeys.of(None, path).secret  # type: ignore[union-attr]
    for text, message in [
        (f"a {WRITER} admin\n", "the third word is read or write"),
        (f"a {WRITER} read extra\n", r"a line is NAME KEY \[read\|write\], got 4"),
    ]:
        path.write_text(text)
        with pytest.raises(NearsightError, match=message) as raised:
            parse_keys_file(path)
        assert "\n" not in str(raised.value)
