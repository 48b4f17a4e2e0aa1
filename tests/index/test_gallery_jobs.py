"""Adding and removing items as typed jobs (issue 32, item 8): nearsight.index.gallery.update's
add_images and remove_items return reports, as the builder does; ``index add | remove`` print
them and ``nearsight.add_images | remove_items`` return their ids; no command or API function
runs the command line."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from helpers import FAST, ROOT, assert_one_line_error, run, tiny_model

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.update import AddReport, RemoveReport, add_images, remove_items


@pytest.fixture()
def copy(onnx_gallery, tmp_path) -> Path:
    shutil.copytree(onnx_gallery.gallery, tmp_path / "g")
    return tmp_path / "g"


def test_add_and_remove_return_reports(onnx_gallery, copy, tmp_path):
    images = sorted(onnx_gallery.data.rglob("*.png"))
    fresh = tmp_path / "fresh.png"
    shutil.copy(images[0], fresh)
    with Gallery.open(copy) as gallery:
        before, largest = len(gallery), int(gallery.labels.max())
    report = add_images(copy, [fresh, tmp_path / "missing.png"], label="red-shoe",
                        meta={"shop": "north", "sku": "0042"}, workers=0)  # fmt: skip
    assert isinstance(report, AddReport)
    assert report.gallery == copy and len(report.ids) == 1 and report.items == before + 1
    assert len(report.skipped) == 1 and "missing.png" in report.skipped[0]
    assert report.replaced is None and report.key is None
    assert "duplicate images" in report.duplicates  # the same bytes as images[0]
    assert report.summary().startswith(f"added 1 items (ids {report.ids[0]}), 1 unreadable")
    again = add_images(copy, [images[1]], label="red-shoe", meta={"sku": 7}, workers=0)
    with Gallery.open(copy) as gallery:
        first, second = gallery.items([*report.ids, *again.ids])
    # a new class name gets a new label, one past the largest; the same name, the same label
    assert first["label"] == second["label"] == largest + 1
    assert first["class_name"] == "red-shoe" and first["meta"] == {"shop": "north", "sku": "0042"}
    assert second["meta"] == {"sku": "7"}  # typed as the column the first add stored: text
    removed = remove_items(copy, ids=[*report.ids, *again.ids])
    assert isinstance(removed, RemoveReport)
    assert removed.ids == sorted([*report.ids, *again.ids]) and removed.items == before
    assert removed.summary().startswith(f"removed 2 items from {copy}: {before} items")


def test_the_cli_prints_the_reports(onnx_gallery, copy, capsys):
    image = sorted(onnx_gallery.data.rglob("*.png"))[3]
    code, out, err = run(capsys, "index", "add", "--gallery", copy, image, "--label", "2",
                         "--class-name", "two", *FAST)  # fmt: skip
    assert code == 0, err
    with Gallery.open(copy) as gallery:
        (added,) = [row for row in gallery.all_items() if row["class_name"] == "two"]
        total = len(gallery)
    assert added["label"] == 2
    assert out.startswith(f"added 1 items (ids {added['id']}) to {copy}: {total} items, in ")
    code, out, err = run(capsys, "index", "remove", "--gallery", copy, "--ids", added["id"])
    assert code == 0 and out.startswith(f"removed 1 items from {copy}: {total - 1} items"), err


def test_the_jobs_take_a_loaded_model_and_check_it(onnx_gallery, copy, tmp_path):
    image = sorted(onnx_gallery.data.rglob("*.png"))[0]
    embedder = nearsight.load_embedder(onnx_gallery.model, device="cpu")
    report = add_images(copy, [image], model=embedder, workers=0)
    with Gallery.open(copy) as gallery:
        (stored,) = gallery.vectors_of(report.ids)
        built = next(row["id"] for row in gallery.all_items() if row["path"] == str(image))
        (original,) = gallery.vectors_of([built])  # the same image, embedded by the build
    assert float(stored @ original) == pytest.approx(1.0, abs=1e-5)
    other = nearsight.load_embedder(tiny_model(tmp_path / "other.pt", seed=1, dim=8), device="cpu")
    with pytest.raises(NearsightError, match="was built with model sha256"):
        add_images(copy, [image], model=other, workers=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda g, i: add_images(g, [i], batch_size=0), "--batch-size must be at least 1"),
        (lambda g, i: add_images(g, [i], label=True), "a whole number or a class name"),
        (lambda g, i: add_images(g, [i], key="k"), "has no key column"),
        (lambda g, i: add_images(g, [i, i], key="k"), "a key names one item"),
        (lambda g, i: remove_items(g), "ids or keys, not both"),
        (lambda g, i: remove_items(g, ids=[]), "ids is empty"),
        (lambda g, i: remove_items(g, ids=["3"]), "an item id is a whole number"),
        (lambda g, i: remove_items(g, ids=[0, 999]), "no item with id 999"),
    ],
)  # fmt: skip
def test_bad_jobs_are_one_line_errors_that_change_nothing(onnx_gallery, copy, call, message):
    image = sorted(onnx_gallery.data.rglob("*.png"))[0]
    with Gallery.open(copy) as gallery:
        before = len(gallery)
    with pytest.raises(NearsightError, match=message) as caught:
        call(copy, image)
    assert "\n" not in str(caught.value)
    with Gallery.open(copy) as gallery:
        assert len(gallery) == before


def test_the_python_api_is_typed(onnx_gallery, copy, capsys):
    image = sorted(onnx_gallery.data.rglob("*.png"))[0]
    with pytest.raises(TypeError, match="colour"):  # not a flag passed through: a typo fails
        nearsight.add_images(copy, [image], colour="red")
    ids = nearsight.add_images(copy, [image], label="shoe", workers=0)
    assert nearsight.get_item(copy, ids[0])["class_name"] == "shoe"
    nearsight.remove_items(copy, ids)
    assert capsys.readouterr().out == ""  # a library call prints no command's report
    code, _, err = run(capsys, "index", "remove", "--gallery", copy, "--ids", ids[0])
    assert_one_line_error(code, err, f"no item with id {ids[0]}")


def test_no_command_or_api_function_runs_the_command_line():
    """Commands, the Python API, the demo and reproduce call typed functions: only the entry
    point (nearsight/app/cli.py) builds the parser and dispatches."""
    callers = []
    for path in sorted((ROOT / "nearsight").rglob("*.py")):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "nearsight.app.cli":
                callers.append(str(path.relative_to(ROOT)))
    assert callers == []
