"""One search route (nearsight.search.route.search_rows), one row shape and one k check
for the CLI, REST, the page and the Python API; REST does not import the page."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from conftest import run

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.data.images import load_image
from nearsight.search.checks import check_k

ROW_KEYS = {"id", "path", "label", "class_name", "distance", "meta"}


def test_rest_does_not_import_the_page():
    code = "import sys, nearsight.app.rest; print('nearsight.app.page_view' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_every_route_answers_the_same_neighbours_in_one_shape(tiny, tiny_page, capsys):
    image = tiny.items[5]["path"]
    code, out, err = run(capsys, "search", "--gallery", tiny.gallery, image, "--k", 5, "--json")
    assert code == 0, err
    cli = json.loads(out)
    with open(image, "rb") as handle:
        files = {"image": ("q.png", handle.read(), "image/png")}
    answer = httpx.post(
        f"{tiny_page[0].rstrip('/')}/api/search", files=files, data={"k": "5"}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    rest = answer.json()["neighbours"]
    with nearsight.open_gallery(tiny.gallery, device="cpu") as gallery:
        python = [dict(row) for row in gallery.search(image, k=5)]
    view = tiny_page[1].nearsight.view("gallery")
    page = [n.as_json() for n in view.search_image(load_image(image, view.embedder.resize), 5)]
    ids = [row["id"] for row in cli]
    assert len(ids) == 5
    for answer_rows in (rest, python, page):
        assert [row["id"] for row in answer_rows] == ids
        assert [row["distance"] for row in answer_rows] == pytest.approx(
            [row["distance"] for row in cli], abs=1e-5
        )
    for answer_rows in (cli, rest, page):
        assert all(set(row) == ROW_KEYS for row in answer_rows)


@pytest.mark.parametrize("k", [0, -1, 2.5, "x", True, None, 65])
def test_one_k_check_for_every_caller(k):
    with pytest.raises(NearsightError, match="k must be a whole number"):
        check_k(k, 64)
    assert check_k(5.0) == 5 and check_k(64, 64) == 64
