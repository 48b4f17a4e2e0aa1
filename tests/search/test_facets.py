"""Facets on every face (the CLI's ``index facets --json``, Python's ``facets()``, REST's
``GET /api/facets``) equal the counts pandas computes from the imported CSV, for filters of
every kind (any-of included), and a bad filter is one line (CLI) or a 4xx (REST)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
from helpers import run, running_page

from nearsight.app.page.facets_box import facet_choices, with_facet
from nearsight.search.searcher import FilterNote, open_gallery

ITEMS, DIM = 240, 8
FILTERS = ([], ["brand=Acme|Bolt"], ["brand!=Acme|Café", "qty>=3"], ["price<20"],
           ["added>=2025-06-01"], ["brand=D\\|E"], ["brand="], ["qty=1|4|7", "price>=5"])  # fmt: skip


@pytest.fixture(scope="module")
def shop(onnx_gallery, tmp_path_factory) -> dict:
    """A gallery imported from a CSV of brands (empty cells, a brand holding '|'), prices
    (some missing), quantities and dates; and the CSV as pandas reads it."""
    folder = tmp_path_factory.mktemp("facets")
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(ITEMS, DIM)).astype(np.float32)
    np.save(folder / "vectors.npy", vectors)
    frame = pd.DataFrame({
        "path": [f"/shop/{i}.jpg" for i in range(ITEMS)],
        "brand": rng.choice(["Acme", "Bolt", "Café", "", "D|E"], ITEMS),
        "price": np.round(rng.uniform(0, 50, ITEMS), 2),
        "qty": rng.integers(0, 9, ITEMS),
        "added": [str(np.datetime64("2025-01-01") + int(d)) for d in rng.integers(0, 300, ITEMS)],
    })  # fmt: skip
    frame.loc[::11, "price"] = np.nan
    frame.to_csv(folder / "meta.csv", index=False)
    gallery = folder / "gallery"
    code = run_main(["index", "import", "--vectors", folder / "vectors.npy", "--meta",
                     folder / "meta.csv", "--out", gallery, "--model", onnx_gallery.model])  # fmt: skip
    assert code == 0
    frame = pd.read_csv(folder / "meta.csv", keep_default_na=False, na_values={"price": [""]})
    return {"gallery": gallery, "frame": frame}


def run_main(argv: list) -> int:
    from nearsight.app.cli import main

    return main([str(arg) for arg in argv])


def allowed(frame: pd.DataFrame, filters: list[str]) -> pd.DataFrame:
    """The rows every filter allows, by pandas (``!=`` also keeps rows without a value)."""
    keep = pd.Series(True, index=frame.index)
    for text in filters:
        key, op, value = re.fullmatch(r"(\w+)(>=|<=|!=|>|<|=)(.*)", text).groups()
        column = frame[key]
        present = column.notna() & (column.astype(str) != "")
        if value == "":
            keep &= ~present if op == "=" else present
            continue
        values = [v.replace("\\|", "|") for v in re.split(r"(?<!\\)\|", value)]
        if key in ("price", "qty"):
            numbers = [float(v) for v in values]
            holds = {"=": column.isin(numbers), "!=": ~column.isin(numbers) | ~present,
                     ">=": column >= numbers[0], "<": column < numbers[0]}[op]  # fmt: skip
        else:
            holds = {"=": column.isin(values), "!=": ~column.isin(values),
                     ">=": present & (column >= values[0])}[op]  # fmt: skip
        keep &= holds & (present | (op == "!="))
    return frame[keep]


def expected(frame: pd.DataFrame) -> dict:
    """What the facets must say of these rows."""
    brands = frame["brand"][frame["brand"] != ""].value_counts()
    return {
        "items": len(frame),
        "brand": {value: int(count) for value, count in brands.items()},
        "brand_missing": int((frame["brand"] == "").sum()),
        "price_missing": int(frame["price"].isna().sum()),
        "price": (frame["price"].min(), frame["price"].max()) if frame["price"].notna().any()
        else (None, None),
        "qty": (int(frame["qty"].min()), int(frame["qty"].max())) if len(frame) else (None, None),
        "added": (frame["added"].min(), frame["added"].max()) if len(frame) else (None, None),
    }  # fmt: skip


def check(answer: dict, rows: pd.DataFrame) -> None:
    want = expected(rows)
    assert answer["items"] == want["items"]
    columns = {column["key"]: column for column in answer["columns"]}
    brand = columns["brand"]
    assert {v["value"]: v["count"] for v in brand["values"]} == want["brand"]
    assert brand["missing"] == want["brand_missing"]
    assert brand["distinct"] == len(want["brand"])
    counts = [v["count"] for v in brand["values"]]
    assert counts == sorted(counts, reverse=True)  # most frequent first
    price = columns["price"]
    assert price["missing"] == want["price_missing"]
    assert (price["low"], price["high"]) == pytest.approx(want["price"])
    assert sum(b["count"] for b in price["histogram"]) == want["items"] - want["price_missing"]
    qty = columns["qty"]
    assert (qty["low"], qty["high"]) == want["qty"]
    if len(rows):  # whole-number bins: exact counts per value range
        for one in qty["histogram"]:
            inside = rows["qty"].between(one["low"], one["high"], inclusive="left")
            assert one["count"] == int(inside.sum())
        dates = columns["added"]
        assert (dates["low"], dates["high"]) == want["added"]
        assert sum(b["count"] for b in dates["histogram"]) == want["items"]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ";".join(f) or "none")
def test_cli_and_python_facets_equal_pandas_counts(shop, filters, capsys):
    rows = allowed(shop["frame"], filters)
    argv = ["index", "facets", "--gallery", shop["gallery"], "--json", "--top", "50"]
    code, out, err = run(capsys, *argv, *[f"--filter={f}" for f in filters])
    assert code == 0, err
    check(json.loads(out), rows)
    with open_gallery(shop["gallery"]) as gallery:
        check(gallery.facets(filters=filters, top=50).as_dict(), rows)


def test_python_takes_a_dict_and_warns_of_values_nobody_holds(shop):
    rows = allowed(shop["frame"], ["brand=Acme|Café"])
    with open_gallery(shop["gallery"]) as gallery, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = gallery.facets(filters={"brand": ["Acme", "Café", "Cafe"]}, top=50)
    check(found.as_dict(), rows)
    notes = [str(w.message) for w in caught if issubclass(w.category, FilterNote)]
    assert len(notes) == 1 and "'Café'" in notes[0], notes
    assert found.notes == notes


def test_rest_facets_equal_pandas_counts_and_refuse_bad_filters(shop):
    frame = shop["frame"]
    with running_page([shop["gallery"]], analyse=False) as (url, demo):
        api = f"{url.rstrip('/')}/api/facets"
        answer = httpx.get(api, params={"filter": ["brand=Acme|Bolt", "qty>=3"], "top": 50},
                           timeout=60)  # fmt: skip
        assert answer.status_code == 200, answer.text
        check(answer.json(), allowed(frame, ["brand=Acme|Bolt", "qty>=3"]))
        whole = httpx.get(api, timeout=60).json()
        check(whole, frame)
        as_json = httpx.get(api, params={"filter": '{"brand": ["Bolt", "Cafe"]}', "top": 50},
                            timeout=60).json()  # fmt: skip
        check(as_json, allowed(frame, ["brand=Bolt|Cafe"]))
        assert any("'Café'" in note for note in as_json["notes"])
        for bad in ("price>cheap", "nokey=1", "brand>A|B", "brand=A|"):
            refused = httpx.get(api, params={"filter": bad}, timeout=60)
            assert 400 <= refused.status_code < 500, (bad, refused.text)
            assert "\n" not in refused.json()["error"]
        assert httpx.get(api, params={"top": 0}, timeout=60).status_code == 422
        # REST search takes the JSON object Python takes: a list is any of its values
        search = f"{url.rstrip('/')}/api/search"
        body = {"id": 5, "k": 300, "filter": {"brand": ["Acme", "D|E"], "qty": 3}}
        found = httpx.post(search, json=body, timeout=60)
        assert found.status_code == 200, found.text
        ids = sorted(n["id"] for n in found.json()["neighbours"])
        assert (
            ids == allowed(frame, ["brand=Acme|D\\|E", "qty=1|3"]).query("qty == 3").index.tolist()
        )
        body["filter"] = {"brand": {"nested": 1}}
        assert httpx.post(search, json=body, timeout=60).status_code == 422
        # the page's facets beside its filter box: the same counts; a pick adds its filter
        page = demo.nearsight
        choices = {picked: label for label, picked in facet_choices(page, page.names[0], "qty>=3")}
        brands = allowed(frame, ["qty>=3"]).query("brand != ''")["brand"].value_counts()
        for value, count in brands.head(3).items():
            picked = f"brand={value.replace('|', chr(92) + '|')}"
            assert choices[picked] == f"brand: {value} ({count})"
        assert with_facet("qty>=3;", "brand=D\\|E") == "qty>=3; brand=D\\|E"
        assert with_facet("qty>=3; brand=Acme", "brand=Acme") == "qty>=3; brand=Acme"
        assert facet_choices(page, page.names[0], "price>cheap") == []
        assert httpx.get(api, params={"filter": "{oops"}, timeout=60).status_code == 422


@pytest.mark.parametrize("bad", ["price>cheap", "brand>A|B", "brand=A|", "nokey=1"])
def test_cli_refuses_a_bad_filter_in_one_line(shop, bad, capsys):
    code, out, err = run(capsys, "index", "facets", "--gallery", shop["gallery"], f"--filter={bad}")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err)


def test_facets_follow_removed_items(shop, tmp_path, capsys):
    """A removed item leaves every count (the payload file still lists it)."""
    import shutil

    copy = Path(shutil.copytree(shop["gallery"], tmp_path / "copy"))
    code, _, err = run(capsys, "index", "remove", "--gallery", copy, "--ids", "0", "1", "2")
    assert code == 0, err
    with open_gallery(copy) as gallery:
        found = gallery.facets(top=50).as_dict()
    check(found, shop["frame"].iloc[3:])
