"""The answers that were silently wrong (issue 32), one test each, on a shop catalog imported
the way a user imports one: a text ``sku`` column mixing ``1003`` and ``0004``, a float
``price``, class names as labels, unlabelled items and a byte-identical duplicate."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from helpers import assert_one_line_error, run, running_page

from nearsight.core.errors import NearsightError
from nearsight.search.searcher import open_gallery

SKUS = ["1003", "0004", "1003x", "77"]
NAMES = ["red-shoe", "blue-bag", "green-hat"]


@pytest.fixture(scope="module")
def shop(tmp_path_factory, onnx_gallery):
    """60 items of the 8-d test model's dim; item 1 is a byte-identical duplicate of item 0."""
    folder = tmp_path_factory.mktemp("shop")
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(60, 8)).astype(np.float32)
    vectors[1] = vectors[0]
    np.save(folder / "v.npy", vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    lines = ["path,label,sku,price"]
    for i in range(60):
        label = "" if i % 10 == 9 else NAMES[i % 3]  # every tenth item unlabelled
        lines.append(f"/shop/{i}.jpg,{label},{SKUS[i % 4]},{1.5 + i % 7}")
    (folder / "m.csv").write_text("\n".join(lines) + "\n")
    gallery = folder / "g"
    code = run_cli("index", "import", "--vectors", folder / "v.npy", "--meta", folder / "m.csv",
                   "--model", onnx_gallery.model, "--index-type", "flat", "--out", gallery)  # fmt: skip
    assert code == 0
    return {"gallery": gallery, "vectors": np.load(folder / "v.npy")}


def run_cli(*argv) -> int:
    from nearsight.app.cli import main

    return main([str(arg) for arg in argv])


def _skus(capsys, gallery, *filters) -> list[str]:
    code, out, err = run(capsys, "search", "--gallery", gallery, "--id", "2", "--k", "60",
                         "--json", *(x for f in filters for x in ("--filter", f)))  # fmt: skip
    assert code == 0, err
    return sorted({row["meta"]["sku"] for row in json.loads(out)})


def test_a_text_column_matches_a_number_looking_value(shop, capsys):
    assert _skus(capsys, shop["gallery"], "sku=1003") == ["1003"]  # was: nothing
    assert _skus(capsys, shop["gallery"], "sku=0004") == ["0004"]
    assert "1003" not in _skus(capsys, shop["gallery"], "sku!=1003")  # was: kept
    with open_gallery(shop["gallery"]) as gallery:
        assert {n.meta["sku"] for n in gallery.search_item(2, 60, filters="sku=1003")} == {"1003"}


def test_a_range_on_a_text_column_is_an_error_naming_its_type(shop, capsys):
    code, _, err = run(capsys, "search", "--gallery", shop["gallery"], "--id", "0", "--filter",
                       "sku<100")  # fmt: skip
    assert_one_line_error(code, err, "sku is a text column")  # was: an empty answer
    assert _skus(capsys, shop["gallery"], "price<3") != []  # a number column still ranges


def test_class_names_filter_and_label_queries(shop, capsys):
    code, out, err = run(capsys, "search", "--gallery", shop["gallery"], "--id", "0", "--k",
                         "60", "--json", "--filter", "label=blue-bag")  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)
    assert rows and {row["class_name"] for row in rows} == {"blue-bag"}  # was: nothing
    code, out, _ = run(capsys, "search", "--gallery", shop["gallery"], "--id", "0", "--k", "60",
                       "--json", "--filter", "class_name=blue-bag")  # fmt: skip
    assert [row["id"] for row in json.loads(out)] == [row["id"] for row in rows]
    code, _, err = run(capsys, "search", "--gallery", shop["gallery"], "--id", "0", "--filter",
                       "label=blue-bgg")  # fmt: skip
    assert_one_line_error(code, err, "no class named 'blue-bgg'", "did you mean 'blue-bag'")
    with open_gallery(shop["gallery"]) as gallery:
        found = gallery.search_vector(shop["vectors"][4], 5, label="blue-bag")  # item 4's class
        with pytest.raises(NearsightError, match="did you mean 'green-hat'"):
            gallery.search_vector(shop["vectors"][4], 5, label="green hat")
    frame = found.to_pandas()  # was: TypeError
    want = [None if n.label is None else n.class_name == "blue-bag" for n in found]
    assert frame["correct"].tolist() == want  # None: an unlabelled neighbour
    assert 'data-correct="true"' in found._repr_html_()


def test_itself_first_at_exactly_zero_before_its_duplicate(shop):
    with open_gallery(shop["gallery"]) as gallery:
        for item, twin in ((0, 1), (1, 0)):
            for rerank in ("none", "dba+aqe:k=2,alpha=3"):
                first, second = gallery.search_item(item, 2, rerank=rerank)
                assert (first.id, first.distance) == (item, 0.0)  # was: the twin, or 0.0011
                assert (second.id, second.distance) == (twin, 0.0)
        others = gallery.search_item(0, 3, leave_out=True)
        assert 0 not in [n.id for n in others] and others[0].id == 1


def test_every_route_puts_the_item_first(shop, capsys):
    code, out, _ = run(capsys, "search", "--gallery", shop["gallery"], "--id", "1", "--k", "2",
                       "--json")  # fmt: skip
    assert [(r["id"], r["distance"]) for r in json.loads(out)] == [(1, 0.0), (0, 0.0)]
    with running_page([shop["gallery"]], analyse=False) as (url, _):
        answer = httpx.post(f"{url.rstrip('/')}/api/search", data={"id": "1", "k": "2"}, timeout=60)
    assert [(r["id"], r["distance"]) for r in answer.json()["neighbours"]] == [(1, 0.0), (0, 0.0)]
