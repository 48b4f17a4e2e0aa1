"""A tag column (``--list-column``) in answers: a list of tags in Python's ``Neighbour.meta``
and ``get_item``, ``search --json``, ``index show`` and REST's items; ``a|b`` in the CLI's table and CSV answers (the form a
CSV's tag cell is read from); added items' tags stored as the build stores them; a tag column
refused as a group column, and a list refused by a column of one value, in one line."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from nearsight.app.cli import main
from nearsight.app.commands.search import write_csv
from nearsight.core.errors import NearsightError
from nearsight.index.gallery.update import tag_cells
from nearsight.search.searcher import open_gallery

TAGS = ["sale|new", "", "eco", " new | sale |new", "sale"]  # as a CSV's cells hold them
HELD = [["sale", "new"], [], ["eco"], ["new", "sale"], ["sale"]]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """A gallery imported from vectors and a CSV with a tag column and a product column."""
    root = tmp_path_factory.mktemp("tagged")
    vectors = np.random.default_rng(0).normal(size=(len(TAGS), 8)).astype(np.float32)
    np.save(root / "vectors.npy", vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    with open(root / "meta.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "tags", "product"])
        writer.writerows([f"{i}.jpg", tags, f"p{i % 2}"] for i, tags in enumerate(TAGS))
    args = ["index", "import", "--vectors", str(root / "vectors.npy"), "--meta",
            str(root / "meta.csv"), "--list-column", "tags"]  # fmt: skip
    assert main([*args, "--out", str(root / "gallery")]) == 0
    return root, args


def test_python_and_json_answers_give_the_tags_as_lists(tagged, capsys):
    root, _ = tagged
    with open_gallery(root / "gallery") as gallery:
        hits = gallery.search_item(0, len(TAGS), rerank="none")
    assert {hit.id: hit.meta.get("tags", []) for hit in hits} == dict(enumerate(HELD))
    capsys.readouterr()
    assert main(["search", "--gallery", str(root / "gallery"), "--id", "3", "--k", "5",
                 "--json"]) == 0  # fmt: skip
    answer = json.loads(capsys.readouterr().out)
    assert {row["id"]: row["meta"].get("tags", []) for row in answer} == dict(enumerate(HELD))


def test_an_item_read_by_id_gives_its_tags_as_a_list(tagged, capsys):
    import nearsight

    root, _ = tagged
    assert nearsight.get_item(root / "gallery", 3)["meta"]["tags"] == HELD[3]
    capsys.readouterr()
    assert main(["index", "show", "--gallery", str(root / "gallery"), "--id", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["tags"] == HELD[0]


def test_the_table_and_csv_answers_write_tags_as_a_csv_cell_does(tagged, capsys):
    root, _ = tagged
    capsys.readouterr()
    assert main(["search", "--gallery", str(root / "gallery"), "--id", "0", "--k", "1"]) == 0
    assert "tags=sale|new" in capsys.readouterr().out
    with open_gallery(root / "gallery") as gallery:
        hits = gallery.search_item(0, len(TAGS), rerank="none")
    out = io.StringIO()
    write_csv(out, [{"query": "q", "neighbours": [hit.as_json() for hit in hits]}])
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert {int(row["id"]): row["tags"] for row in rows} == {
        i: "|".join(held) for i, held in enumerate(HELD)
    }


def test_a_tag_column_is_no_group_column(tagged, capsys):
    root, args = tagged
    with open_gallery(root / "gallery") as gallery:
        with pytest.raises(NearsightError, match="'tags' is a tag column"):
            gallery.search_item(0, 3, rerank="none", group_by="tags")
        assert gallery.search_item(0, 3, rerank="none", group_by="product").groups
    capsys.readouterr()
    assert main([*args, "--out", str(root / "grouped"), "--group-column", "tags"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--group-column tags: a tag column" in err, err
    assert not (root / "grouped").exists()


def test_added_tags_are_stored_as_built_ones_and_lists_need_a_tag_column():
    tags = frozenset({"tags"})
    assert tag_cells({"tags": [" b", "a", "b"], "shop": "x"}, tags) == {"tags": "b|a", "shop": "x"}
    assert tag_cells({"tags": "a| b |a"}, tags) == {"tags": "a|b"}
    assert tag_cells({"tags": []}, tags) == {"tags": None}
    with pytest.raises(NearsightError, match="'shop': a list of values is for a tag column"):
        tag_cells({"shop": ["x", "y"]}, tags)
    with pytest.raises(NearsightError, match="a tag may not hold"):
        tag_cells({"tags": ["a|b"]}, tags)
