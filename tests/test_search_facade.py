"""One search façade (issue 22): the CLI, REST on a real server, the page's view and the Python
API find the same neighbours for the same query through nearsight.index.search.query.search,
and REST does not import the page's view module."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from conftest import run, running_page

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.index.search.query import check_k

K = 5


@pytest.fixture(scope="module")
def served(onnx_gallery):
    with running_page([onnx_gallery.gallery], analyse=False) as (url, demo):
        yield url.rstrip("/"), demo


def test_every_front_end_finds_the_same_neighbours(served, onnx_gallery, capsys):
    url, demo = served
    query = onnx_gallery.query
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        python = [(row["id"], row["distance"]) for row in gallery.search(query, K)]
        by_item = [row["id"] for row in gallery.search_item(python[0][0], K)]
    code, out, _ = run(
        capsys,
        "search",
        "--gallery",
        str(onnx_gallery.gallery),
        str(query),
        "--k",
        str(K),
        "--json",
    )
    assert code == 0
    cli = [(row["id"], row["distance"]) for row in json.loads(out)]
    with query.open("rb") as handle:
        answer = httpx.post(
            f"{url}/api/search",
            files={"image": (query.name, handle)},
            data={"k": str(K)},
            timeout=60,
        )
    assert answer.status_code == 200, answer.text
    rest = [(row["id"], row["distance"]) for row in answer.json()["neighbours"]]
    assert len(python) == K
    assert [i for i, _ in cli] == [i for i, _ in python] == [i for i, _ in rest]
    for found in (cli, rest):
        assert [d for _, d in found] == pytest.approx([d for _, d in python], abs=1e-4)
    # by a gallery item: REST and Python give it first; the page's view leaves it out
    item = python[0][0]
    answer = httpx.post(f"{url}/api/search", data={"k": str(K), "id": str(item)}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert [row["id"] for row in answer.json()["neighbours"]] == by_item
    (view,) = demo.nearsight.views.values()
    assert [n.id for n in view.search_item(item, K - 1)] == [i for i in by_item if i != item]


def test_rest_answers_in_the_one_json_shape(served, onnx_gallery):
    url, _ = served
    with onnx_gallery.query.open("rb") as handle:
        answer = httpx.post(
            f"{url}/api/search", files={"image": ("q.png", handle)}, data={"k": "2"}, timeout=60
        )
    (first, _) = answer.json()["neighbours"]
    assert list(first) == ["id", "path", "label", "class_name", "distance", "meta"]


def test_rest_does_not_import_the_page_view():
    code = (
        "import sys, nearsight.app.rest; "
        "print('nearsight.app.page_view' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3", None, float("nan")])
def test_one_k_check_refuses_what_is_not_a_count(bad):
    with pytest.raises(NearsightError, match="k must be an integer"):
        check_k(bad)


def test_one_k_check_takes_whole_numbers_and_a_bound():
    assert check_k(3) == 3 and check_k(4.0) == 4
    assert check_k(64, 64) == 64
    with pytest.raises(NearsightError, match="from 1 to 64"):
        check_k(65, 64)
