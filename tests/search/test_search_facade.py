"""One search route (nearsight.search.route.search), one result type (Neighbour) and one k
check for the CLI, REST, the page and the Python API; REST does not import the page."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from helpers import run

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.search.checks import check_k
from nearsight.search.neighbour import FIELDS

ROW_KEYS = set(FIELDS)


def test_rest_does_not_import_the_page():
    code = "import sys, nearsight.app.rest; print('nearsight.app.page.view' in sys.modules)"
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
    page = json.loads(tiny_page[1].nearsight.api_search(str(image), 5, "gallery"))
    ids = [row["id"] for row in cli]
    assert len(ids) == 5
    for answer_rows in (rest, python, page):
        assert [row["id"] for row in answer_rows] == ids
        assert [row["distance"] for row in answer_rows] == pytest.approx(
            [row["distance"] for row in cli], abs=1e-5
        )
    for answer_rows in (cli, page, python):
        assert all(set(row) == ROW_KEYS for row in answer_rows)
    assert all(set(row) == {*ROW_KEYS, "image_url"} for row in rest)  # REST adds the image's
    assert cli[0]["id"] == 5 and cli[0]["distance"] == 0.0  # the gallery's own file: first, at 0


@pytest.mark.parametrize("k", [0, -1, 2.5, "x", True, None, 65])
def test_one_k_check_for_every_caller(k):
    with pytest.raises(NearsightError, match="k must be a whole number"):
        check_k(k, 64)
    assert check_k(5.0) == 5 and check_k(64, 64) == 64
