"""What a shop met last round, each fixed: --key against --meta KEYCOLUMN=, --meta-types naming
no column, a wrong-case --key-column, --images given a folder, the --vector shape message, a
metadata column named ``query`` in ``search_many().to_pandas()`` and ids that stay whole when a
query fails, the notebook grid's query card naming its class, and ``demo`` saying torch is
missing before it makes its dataset."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
from helpers import FAST, run

from nearsight.search.neighbour import Neighbour
from nearsight.search.results import ResultsList, SearchResults
from nearsight.search.searcher import open_gallery


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


def one_line_error(code: int, err: str, fragment: str) -> None:
    errors = [line for line in err.splitlines() if line.startswith("nearsight: error: ")]
    assert code == 2 and len(errors) == 1 and fragment in errors[0], err
    assert "Traceback" not in err


def test_build_refuses_unknown_declared_columns_and_wrong_case_keys(capsys, shop, tmp_path):
    manifest = shop["root"] / "data" / "shop.csv"
    build = ["index", "build", "--model", shop["model"], "--dataset", "csv", "--root", manifest,
             "--out", tmp_path / "g", *FAST]  # fmt: skip
    code, _, err = run(capsys, *build, "--meta-types", "nosuch=str")
    one_line_error(code, err, "no column 'nosuch'")
    code, _, err = run(capsys, *build, "--key-column", "SKU")
    one_line_error(code, err, "did you mean 'sku'?")
    code, _, err = run(capsys, "index", "build", "--model", shop["model"], "--images",
                       shop["root"] / "data", "--out", tmp_path / "g", *FAST)  # fmt: skip
    one_line_error(code, err, "is a folder")
    assert not (tmp_path / "g").exists()


def test_add_refuses_two_different_keys(capsys, shop, tmp_path):
    gallery = tmp_path / "gallery"
    shutil.copytree(shop["gallery"], gallery)
    image = shop["images"][0]
    code, _, err = run(capsys, "index", "add", "--gallery", gallery, image, "--key", "K1",
                       "--meta", "sku=K2", *FAST)  # fmt: skip
    one_line_error(code, err, "name two keys")


def test_vector_shape_message_names_the_file_and_the_dim(capsys, shop, tmp_path):
    two = tmp_path / "two.npy"
    np.save(two, np.ones((2, 16), np.float32))
    code, _, err = run(capsys, "search", "--gallery", shop["gallery"], "--vector", two)
    one_line_error(code, err, "holds float32 (2, 16): 2 vectors")
    assert "[16] or [1, 16]" in err


def test_to_pandas_keeps_a_query_column_and_whole_ids():
    hit = Neighbour(1, 7, None, "a.png", 2, "bird", 0.5, {"query": "mine", "error": "x"})
    results = ResultsList([SearchResults([hit], query=0), SearchResults(query=1, error="bad")])
    frame = results.to_pandas()
    assert list(frame["query"]) == [0, 1]  # the query's position, not the metadata
    assert frame.loc[0, "meta.query"] == "mine" and frame.loc[0, "meta.error"] == "x"
    assert str(frame["id"].dtype) == "Int64" and frame.loc[0, "id"] == 7
    assert frame.loc[1, "error"] == "bad"


def test_notebook_query_card_names_the_class(shop):
    with open_gallery(shop["gallery"]) as gallery:
        found = gallery.search_item(0, 3)
        name = gallery.gallery.class_names()[found.query_label]
        assert name in found._repr_html_().split("#1")[0]


def test_demo_says_torch_is_missing_before_making_its_dataset(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    code, _, err = run(capsys, "demo", "--workdir", tmp_path / "demo", "--no-launch")
    one_line_error(code, err, "pip install 'nearsight[train]'")
    assert not (tmp_path / "demo").exists()
