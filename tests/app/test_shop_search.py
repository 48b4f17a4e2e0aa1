"""A shop's searches on every route (the CLI, Python, REST): search by key (the item itself
first, at distance 0), filter notes naming the closest values a column holds, typos refused,
ISO date ranges, ``KEY=`` for items without a value, dict filters, ``index info`` and
``/api/galleries`` from one function, JSON bodies and the typed OpenAPI schema."""

from __future__ import annotations

import json
import warnings

import httpx
import numpy as np
import pytest
from helpers import SHOP_SINCE, run, running_page

from nearsight.core.errors import NearsightError
from nearsight.search.searcher import FilterNote, open_gallery


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


KEY = "00007"


@pytest.fixture(scope="module")
def catalog(shop):
    """id -> metadata of every item."""
    with open_gallery(shop["gallery"]) as gallery:
        return {int(row["id"]): row["meta"] for row in gallery.gallery.all_items()}


@pytest.fixture(scope="module")
def api(shop):
    with running_page([shop["gallery"]], analyse=False) as (url, demo):
        yield f"{url.rstrip('/')}/api", demo


def ids_where(catalog, test) -> set[int]:
    return {item for item, meta in catalog.items() if test(meta)}


# -- the CLI --------------------------------------------------------------------------------


def test_cli_search_by_key_finds_the_item_first(capsys, shop, catalog):
    code, out, _ = run(capsys, "search", "--gallery", shop["gallery"], "--key", KEY, "--k", 3,
                       "--json")  # fmt: skip
    found = json.loads(out)
    assert code == 0 and found[0]["key"] == KEY and found[0]["distance"] == 0.0
    assert catalog[found[0]["id"]]["sku"] == KEY
    assert "Müsli" in out  # unicode as is, not \u00fc
    code, _, err = run(capsys, "search", "--gallery", shop["gallery"], "--key", "nope")
    assert code == 2 and err.count("\n") == 1 and "no item with key 'nope'" in err


def test_cli_filter_notes_typos_dates_and_missing_values(capsys, shop, catalog):
    base = ["search", "--gallery", shop["gallery"], "--id", 0, "--k", 36, "--json"]
    code, out, err = run(capsys, *base, "--filter", "shop=cafe")
    assert code == 0 and json.loads(out) == [] and "'Café'" in err and "note" in err
    code, out, err = run(capsys, *base, "--filter", "sku=7")
    assert code == 0 and f"'{KEY}'" in err  # the zero-padded SKU is named
    code, _, err = run(capsys, *base, "--filter", "shop==Café")
    assert code == 2 and "typo" in err and "'shop=Café'" in err
    code, out, _ = run(capsys, *base, "--filter", f"added>={SHOP_SINCE}")
    since = ids_where(catalog, lambda meta: meta["added"] >= SHOP_SINCE)
    assert code == 0 and {n["id"] for n in json.loads(out)} == since and 0 < len(since) < 36
    code, out, _ = run(capsys, *base, "--filter", "added<2025-05-01")
    assert {n["id"] for n in json.loads(out)} == ids_where(
        catalog, lambda m: m["added"] < "2025-05-01"
    )
    code, out, _ = run(capsys, *base, "--filter", "colour=")
    blank = ids_where(catalog, lambda meta: "colour" not in meta)
    assert code == 0 and {n["id"] for n in json.loads(out)} == blank and blank
    code, out, _ = run(capsys, *base, "--filter", "colour!=")
    assert {n["id"] for n in json.loads(out)} == set(catalog) - blank
    code, out, _ = run(capsys, *base, "--filter", "colour!=red")  # missing values included
    assert {n["id"] for n in json.loads(out)} == ids_where(
        catalog, lambda m: m.get("colour") != "red"
    )
    code, _, err = run(capsys, *base, "--filter", "added>June")
    assert code == 2 and "ISO date" in err


def test_index_info_names_the_facts(capsys, shop):
    code, out, _ = run(capsys, "index", "info", "--gallery", shop["gallery"], "--json")
    info = json.loads(out)
    assert code == 0 and info["items"] == 36 and info["dim"] == 16
    assert info["index_type"] == "flat" and info["key_column"] == "sku"
    assert info["columns"] == {"added": "date", "colour": "str", "name": "str",
                               "price": "float", "shop": "str", "sku": "str"}  # fmt: skip
    code, out, _ = run(capsys, "index", "info", "--gallery", shop["gallery"])
    assert code == 0 and "key column: sku" in out and "added (date)" in out


# -- Python -----------------------------------------------------------------------------------


def test_python_search_by_key_notes_and_dict_filters(shop, catalog):
    with open_gallery(shop["gallery"]) as gallery:
        found = gallery.search_item(key=KEY, k=3)
        assert found[0].key == KEY and found[0].distance == 0.0
        with pytest.warns(FilterNote, match="'Café'"):
            assert len(gallery.search_item(0, 5, filters="shop=cafe")) == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a value the column holds: no note
            cafe = gallery.search_item(0, 36, filters={"shop": "Café"})
        assert {n.id for n in cafe} == ids_where(catalog, lambda m: m["shop"] == "Café")
        blank = gallery.search_item(0, 36, filters={"colour": None})
        assert {n.id for n in blank} == ids_where(catalog, lambda m: "colour" not in m)
        with pytest.raises(NearsightError, match="not both"):
            gallery.search_item(0, key=KEY)


# -- REST ---------------------------------------------------------------------------------------


def test_rest_json_body_queries_by_id_key_and_vector(api, shop, catalog):
    url, demo = api
    by_key = httpx.post(f"{url}/search", json={"key": KEY, "k": 3}, timeout=30)
    assert by_key.status_code == 200, by_key.text
    first = by_key.json()["neighbours"][0]
    assert first["key"] == KEY and first["distance"] == 0.0 and by_key.json()["notes"] == []
    by_id = httpx.post(f"{url}/search", json={"id": first["id"], "k": 3}, timeout=30).json()
    assert by_id["neighbours"] == by_key.json()["neighbours"]
    vector = demo.nearsight.view(None).item_vector(first["id"]) * 2
    by_vector = httpx.post(f"{url}/search", json={"vector": vector.tolist(), "k": 3}, timeout=30)
    assert [n["id"] for n in by_vector.json()["neighbours"]] == [
        n["id"] for n in by_id["neighbours"]
    ]
    form = httpx.post(f"{url}/search", data={"key": KEY, "k": 3}, timeout=30).json()
    assert form["neighbours"] == by_id["neighbours"]
    both = httpx.post(f"{url}/search", json={"id": 1, "key": KEY}, timeout=30)
    assert both.status_code == 422 and "exactly one of" in both.json()["error"]
    missing = httpx.post(f"{url}/search", json={"key": "nope"}, timeout=30)
    assert missing.status_code == 404 and missing.json() == {
        "error": f"gallery {demo.nearsight.galleries.names[0]} has no item with that key"
    }
    typo = httpx.post(f"{url}/search", json={"id": 1, "filter": "shop==Café"}, timeout=30)
    assert typo.status_code == 400 and "typo" in typo.json()["error"]
    noted = httpx.post(f"{url}/search", json={"key": KEY, "filter": "shop=cafe"}, timeout=30)
    assert noted.json()["neighbours"] == [] and "'Café'" in noted.json()["notes"][0]
    since = httpx.post(f"{url}/search", json={"id": 0, "k": 36, "filter": [f"added>={SHOP_SINCE}"]},
                       timeout=30).json()  # fmt: skip
    assert {n["id"] for n in since["neighbours"]} == ids_where(
        catalog, lambda m: m["added"] >= SHOP_SINCE
    )


def test_rest_galleries_are_the_facts_of_index_info(api, shop, capsys):
    url, demo = api
    answer = httpx.get(f"{url}/galleries", timeout=30).json()["galleries"]
    _, out, _ = run(capsys, "index", "info", "--gallery", shop["gallery"], "--json")
    assert answer == [
        {"name": demo.nearsight.galleries.names[0], "generation": 0, **json.loads(out)}
    ]
    health = httpx.get(f"{url}/health", timeout=30).json()
    assert health == {"status": "ok", "galleries": answer}
    item = httpx.get(f"{url}/items/by-key", params={"key": KEY}, timeout=30).json()
    assert item["key"] == KEY and item["meta"]["sku"] == KEY


def test_openapi_types_every_answer(api):
    url, _ = api
    schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
    parts = schema["components"]["schemas"]
    search = schema["paths"]["/search"]["post"]
    answer = search["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/SearchAnswer"}
    neighbours = parts["SearchAnswer"]["properties"]["neighbours"]
    assert neighbours["items"] == {"$ref": "#/components/schemas/Neighbour"}
    assert {"id", "key", "distance", "meta"} <= set(parts["Neighbour"]["required"])
    assert set(search["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    for path in schema["paths"].values():
        for operation in path.values():
            for status, response in operation["responses"].items():
                if status == "200" and "image/*" in response["content"]:  # an item's image
                    assert list(response["content"]) == ["image/*"]
                    continue
                body = response["content"]["application/json"]["schema"]
                if status in ("200", "201"):  # 201: an item posted
                    assert body.get("$ref") and "additionalProperties" not in body
                else:  # the real error shape, never FastAPI's HTTPValidationError
                    assert body == {"$ref": "#/components/schemas/Error"}, (status, body)
    assert "HTTPValidationError" not in parts


def test_api_docs_are_served_from_packaged_files(api):
    url, _ = api
    page = httpx.get(f"{url}/docs", timeout=30)
    assert page.status_code == 200 and "swagger-ui" in page.text
    sources = [s for s in np.unique(__import__("re").findall(r'(?:src|href)="([^"]+)"', page.text))]
    assert sources and all(s.startswith("/api/docs-assets/") for s in sources), sources
    for source in sources:
        assert httpx.get(f"{url.removesuffix('/api')}{source}", timeout=30).status_code == 200
