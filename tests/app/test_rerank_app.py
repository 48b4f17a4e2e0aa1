"""Re-ranking through the command line, the REST API and the page, on a real gallery."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest
from helpers import run, running_page

from nearsight.index.gallery.core import Gallery
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.rerank import parse_rerank
from nearsight.search.rerank.search import reranked_search
from nearsight.search.route import stored_rerank


@pytest.fixture(scope="module")
def product(product_once):
    """The session's product gallery (helpers.make_product): this module only reads it."""
    return product_once


SPEC = "dba+aqe:k=2,alpha=3,depth=20"


def test_eval_reranks_leave_one_out_and_says_so(product, capsys):  # noqa: F811
    code, out, err = run(
        capsys, "eval", "--gallery", product["gallery"], "--rerank", SPEC, "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["rerank"] == str(parse_rerank(SPEC))
    with Gallery.open(product["gallery"]) as gallery:
        want = evaluate_gallery(gallery, rerank=SPEC)
    assert got["map@r"] == pytest.approx(want["map@r"], abs=1e-12)
    code, out, _ = run(capsys, "eval", "--gallery", product["gallery"], "--json")
    assert json.loads(out)["rerank"] == "none"  # off unless asked or stored


def test_a_bad_rerank_spec_is_a_usage_error(product, capsys):  # noqa: F811
    for command in ("eval", "search"):
        with pytest.raises(SystemExit) as exit_info:
            run(
                capsys, command, "--gallery", product["gallery"], "--id", "0", "--rerank", "aqe:k=x"
            )
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "rerank parameter k needs a number" in err and "Traceback" not in err


def test_tuning_on_validation_stores_the_choice_and_search_uses_it(product, tmp_path, capsys):  # noqa: F811
    test = tmp_path / "test"
    shutil.copytree(product["gallery"], test)
    val = tmp_path / "val"
    shutil.copytree(product["gallery"], val)
    code, out, err = run(capsys, "eval", "--gallery", test, "--tune-on", val, "--save", "--json")
    assert code == 0, err
    assert "chose rerank" in err and "map@r" in err  # the tuning table
    with Gallery.open(test) as gallery:
        stored = gallery.meta["rerank"]
        assert gallery.meta["rerank_tuned_on"] == str(val)
        spec = stored_rerank(gallery)
        vector = gallery.vectors_of([3])
        _, want = reranked_search(gallery, vector, 5, spec)
    assert json.loads(out)["rerank"] == stored
    code, out, err = run(capsys, "search", "--gallery", test, "--id", "3", "--k", "5", "--json")
    assert code == 0, err
    assert [row["id"] for row in json.loads(out)] == want[0].tolist()
    # the same gallery cannot be its own validation set
    code, _, err = run(capsys, "eval", "--gallery", test, "--tune-on", test)
    assert code == 2 and "validation classes" in err


@pytest.fixture(scope="module")
def served(product):  # noqa: F811
    with running_page([product["gallery"]], analyse=False) as (url, demo):
        yield url.rstrip("/"), demo


def test_rest_search_takes_a_rerank_and_refuses_a_bad_one(served, product):  # noqa: F811
    url, demo = served
    answer = httpx.post(f"{url}/api/search", data={"id": "4", "k": "6", "rerank": SPEC}, timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["rerank"] == str(parse_rerank(SPEC))
    with Gallery.open(product["gallery"]) as gallery:
        _, want = reranked_search(gallery, gallery.vectors_of([4]), 6, parse_rerank(SPEC))
    assert [n["id"] for n in body["neighbours"]] == want[0].tolist()
    plain = httpx.post(f"{url}/api/search", data={"id": "4", "k": "6"}, timeout=60).json()
    assert plain["rerank"] == "none"
    bad = httpx.post(f"{url}/api/search", data={"id": "4", "rerank": "diffusion"}, timeout=60)
    assert bad.status_code == 422 and "unknown rerank method" in bad.text


def test_page_toggle_and_the_fixed_and_broken_list(served, product):  # noqa: F811
    page = served[1].nearsight
    view = page.view(None)
    item = int(view.labelled_ids[5])
    spec = page.rerank_spec(view, True)
    assert spec.active and page.rerank_spec(view, False).method == "none"
    on = view.search_one(view.item_vector(item), 5, rerank=spec, exclude_id=item)
    with Gallery.open(product["gallery"]) as gallery:
        _, want = reranked_search(gallery, gallery.vectors_of([item]), 5, spec, exclude=[item])
    assert [n.id for n in on] == want[0].tolist()
    grid_on, _, _ = page.item_grid(view.name, item, 5, "", True)
    grid_off, _, _ = page.item_grid(view.name, item, 5, "", False)
    assert all(f'data-id="{n.id}"' in grid_on for n in on)
    assert grid_off == page.item_grid(view.name, item, 5, "")[0]  # default: the view's (none)
    frame, note = page.rerank_changes(view.name)
    fixed = int((frame["re-ranking"] == "fixed").sum())
    assert f"**{fixed}** queries fixed" in note
    with Gallery.open(product["gallery"]) as gallery:
        labels = dict(zip(gallery.ids.tolist(), gallery.labels.tolist(), strict=True))
    for row in frame.itertuples(index=False):  # each row really changed correctness
        before_right = labels[row[2]] == labels[row[0]]
        after_right = labels[row[4]] == labels[row[0]]
        assert before_right != after_right and (row[6] == "fixed") == after_right
    assert np.all(frame["re-ranking"].iloc[:fixed] == "fixed")
