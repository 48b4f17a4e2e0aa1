"""A product catalog's traps (issue 23): splits that fit the data, whole-column metadata types,
unknown filter keys, labels as class names or none, stable item keys, duplicate images."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import FAST, assert_one_line_error, run, server_settings, tiny_model

from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> Iterator[dict]:
    """72 product photos (12 classes x 6) and a random 16-d model."""
    root = tmp_path_factory.mktemp("shop")
    write_synthetic(root / "data", classes=12, per_class=6, size=32)
    images = sorted((root / "data").rglob("*.png"))
    assert len(images) == 72
    yield {"root": root, "images": images, "model": tiny_model(root / "model.pt", seed=0)}
    shutil.rmtree(root, ignore_errors=True)


def _csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _build(capsys, shop, manifest: Path, out: Path, *extra) -> tuple[int, str, str]:
    return run(capsys, "index", "build", "--model", shop["model"], "--dataset", "csv",
               "--root", manifest, "--out", out, *FAST, *extra)  # fmt: skip


def _rows(shop, extra=lambda n: []) -> list[list]:
    return [[image, image.parent.name, *extra(n)] for n, image in enumerate(shop["images"])]


def test_a_csv_without_a_split_column_indexes_every_item(shop, tmp_path, capsys):
    manifest = _csv(tmp_path / "all.csv", ["path", "label"], _rows(shop))
    code, _, err = _build(capsys, shop, manifest, tmp_path / "g")
    assert code == 0, err
    assert "split: all" in err
    with Gallery.open(tmp_path / "g") as gallery:
        assert len(gallery) == 72
        assert {row["split"] for row in gallery.all_items()} == {None}  # none invented


def test_a_split_column_is_kept_per_item_and_auto_takes_its_test_rows(shop, tmp_path, capsys):
    manifest = _csv(tmp_path / "split.csv", ["path", "label", "split"],
                    _rows(shop, lambda n: ["test" if n % 3 == 0 else "train"]))  # fmt: skip
    code, _, err = _build(capsys, shop, manifest, tmp_path / "auto")
    assert code == 0 and "split: test" in err
    with Gallery.open(tmp_path / "auto") as gallery:
        assert len(gallery) == 24
    code, _, err = _build(capsys, shop, manifest, tmp_path / "whole", "--split", "all")
    assert code == 0, err
    code, out, _ = run(capsys, "search", "--gallery", tmp_path / "whole", "--id", "0", "--k", "72",
                       "--filter", "split=test", "--json")  # fmt: skip
    assert code == 0 and len(json.loads(out)) == 24  # each item's own split, not "all"


@pytest.fixture(scope="module")
def catalog(shop, tmp_path_factory) -> Iterator[dict]:
    """A gallery with shop, price, sku (one '091': a text column) and a unique key column."""
    root = tmp_path_factory.mktemp("catalog")
    skus = ["091", "050", "430", *(f"{n + 500}" for n in range(69))]
    rows = _rows(shop, lambda n: [("north", "south")[n % 2], f"{n * 1.5:.1f}", skus[n], f"K{n}"])
    manifest = _csv(root / "shop.csv", ["path", "label", "shop", "price", "sku", "key"], rows)
    yield {"manifest": manifest, "gallery": root / "g", "skus": skus, "root": root}
    shutil.rmtree(root, ignore_errors=True)


def test_unknown_filter_keys_are_refused_with_the_gallerys_keys(shop, catalog, capsys):
    code, _, err = _build(capsys, shop, catalog["manifest"], catalog["gallery"])
    assert code == 0, err
    code, _, err = run(capsys, "search", "--gallery", catalog["gallery"], "--id", "0",
                       "--filter", "colour=red")  # fmt: skip
    assert_one_line_error(code, err, "unknown filter key 'colour'", "key", "price", "shop", "sku")
    from nearsight import open_gallery
    from nearsight.core.errors import NearsightError

    with open_gallery(catalog["gallery"]) as gallery, pytest.raises(NearsightError, match="colour"):
        gallery.search_item(0, 3, filters="colour=red")
    with open_gallery(catalog["gallery"]) as gallery, pytest.raises(ValueError, match="shop"):
        gallery.search_item(0, 3, filters="colour=red")  # a bad argument, as Python expects


def test_a_column_is_numeric_only_when_all_of_it_is_or_when_declared(
    shop, catalog, tmp_path, capsys
):
    if not catalog["gallery"].exists():
        assert _build(capsys, shop, catalog["manifest"], catalog["gallery"])[0] == 0

    def skus(gallery, *filters):
        found = run(capsys, "search", "--gallery", gallery, "--id", "0", "--k", "72", "--json",
                    *(x for f in filters for x in ("--filter", f)))  # fmt: skip
        assert found[0] == 0, found[2]
        return sorted(row["meta"]["sku"] for row in json.loads(found[1]))

    with Gallery.open(catalog["gallery"]) as gallery:
        assert gallery.meta["meta_types"]["sku"] == "str"  # '091' keeps the column text
        values = {row["meta"]["key"]: row["meta"]["sku"] for row in gallery.all_items()}
    assert values["K0"] == "091" and values["K2"] == "430"  # text, not the number 430
    refused = run(
        capsys, "search", "--gallery", catalog["gallery"], "--id", "0", "--filter", "sku<100"
    )
    assert_one_line_error(refused[0], refused[2], "sku is a text column; < compares numbers")
    assert skus(catalog["gallery"], "sku=091") == ["091"]
    declared = tmp_path / "declared"
    code, _, err = _build(capsys, shop, catalog["manifest"], declared, "--meta-types", "sku=int")
    assert code == 0, err
    assert skus(declared, "sku<100") == [50, 91]  # 091 and 050 as numbers
    bad = _build(capsys, shop, catalog["manifest"], tmp_path / "bad", "--meta-types", "shop=int")
    assert_one_line_error(bad[0], bad[2], "'shop' is declared int", "north")


def test_import_takes_class_names_as_labels_and_evaluates(tmp_path, capsys):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(100), 3)
    vectors = rng.normal(size=(100, 8))[labels] + 0.1 * rng.normal(size=(300, 8))
    np.save(tmp_path / "v.npy", vectors.astype(np.float32))
    _csv(tmp_path / "m.csv", ["label", "shop"], [[f"c{x}", "north"] for x in labels])
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "v.npy", "--meta",
                       tmp_path / "m.csv", "--out", tmp_path / "g")  # fmt: skip
    assert code == 0, err
    code, out, err = run(capsys, "eval", "--gallery", tmp_path / "g", "--json")
    assert code == 0, err
    assert json.loads(out)["queries"] == 300 and json.loads(out)["recall@1"] > 0.9
    with Gallery.open(tmp_path / "g") as gallery:
        first = gallery.items([0, 3])
    assert first[0]["class_name"] == "c0" and first[1]["class_name"] == "c1"
    assert first[0]["label"] != first[1]["label"]


def test_import_takes_meta_types_and_a_key_column(tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.random.default_rng(1).normal(size=(6, 8)).astype(np.float32))
    rows = [[f"A{n}", f"{n:03d}" if n else "091", f"c{n % 2}"] for n in range(6)]
    _csv(tmp_path / "m.csv", ["sku", "code", "label"], rows)

    def build(out, *extra):
        return run(capsys, "index", "import", "--vectors", tmp_path / "v.npy", "--meta",
                   tmp_path / "m.csv", "--out", tmp_path / out, *extra)  # fmt: skip

    def codes(out, *filters):
        found = run(capsys, "search", "--gallery", tmp_path / out, "--id", "0", "--k", "6",
                    "--json", *(x for f in filters for x in ("--filter", f)))  # fmt: skip
        assert found[0] == 0, found[2]
        return sorted(row["meta"]["code"] for row in json.loads(found[1]))

    assert build("text")[0] == 0
    refused = run(
        capsys, "search", "--gallery", tmp_path / "text", "--id", "0", "--filter", "code<100"
    )
    assert_one_line_error(refused[0], refused[2], "code is a text column")  # leading zeros
    code, _, err = build("typed", "--meta-types", "code=int", "--key-column", "sku")
    assert code == 0, err
    assert codes("typed", "code<100") == [1, 2, 3, 4, 5, 91]
    code, out, err = run(capsys, "index", "remove", "--gallery", tmp_path / "typed", "--keys", "A2")
    assert code == 0 and "removed 1 items" in out, err
    with Gallery.open(tmp_path / "typed") as gallery:
        assert gallery.meta["key_column"] == "sku"
        assert sorted(row["meta"]["sku"] for row in gallery.all_items()) == [
            "A0", "A1", "A3", "A4", "A5"
        ]  # fmt: skip


def test_import_without_a_label_column(tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.random.default_rng(2).normal(size=(6, 8)).astype(np.float32))
    _csv(tmp_path / "m.csv", ["shop"], [[("north", "south")[n % 2]] for n in range(6)])
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "v.npy", "--meta",
                       tmp_path / "m.csv", "--out", tmp_path / "g")  # fmt: skip
    assert code == 0, err
    code, out, err = run(capsys, "search", "--gallery", tmp_path / "g", "--id", "0", "--k", "6",
                         "--filter", "shop=north", "--json")  # fmt: skip
    assert code == 0 and sorted(row["id"] for row in json.loads(out)) == [0, 2, 4], err
    code, _, err = run(capsys, "eval", "--gallery", tmp_path / "g")
    assert_one_line_error(code, err, "0 labelled items")


def test_unlabelled_items_are_searchable_filterable_and_counted_by_eval(shop, tmp_path, capsys):
    rows = [[image, image.parent.name if n < 12 else "", ("north", "south")[n % 2]]
            for n, image in enumerate(shop["images"])]  # fmt: skip
    manifest = _csv(tmp_path / "half.csv", ["path", "label", "shop"], rows)
    code, _, err = _build(capsys, shop, manifest, tmp_path / "g")
    assert code == 0, err
    code, out, _ = run(capsys, "search", "--gallery", tmp_path / "g", "--id", "40", "--k", "72",
                       "--filter", "shop=north", "--json")  # fmt: skip
    assert code == 0 and len(json.loads(out)) == 36
    code, out, _ = run(capsys, "eval", "--gallery", tmp_path / "g")
    assert code == 0 and "12 labelled items queried; 60 unlabelled items left out" in out
    no_labels = _csv(tmp_path / "none.csv", ["path", "shop"], [[r[0], r[2]] for r in rows])
    assert _build(capsys, shop, no_labels, tmp_path / "none")[0] == 0


def test_keys_upsert_remove_and_serve(shop, catalog, tmp_path, capsys):
    folder = tmp_path / "keyed"
    shutil.copytree(catalog["gallery"], folder) if catalog["gallery"].exists() else None
    if not folder.exists():
        assert _build(capsys, shop, catalog["manifest"], folder)[0] == 0
    with Gallery.open(folder) as gallery:
        assert gallery.meta["key_column"] == "key"
        before = len(gallery)
        old = next(row["id"] for row in gallery.all_items() if row["meta"]["key"] == "K7")
    photo = shop["images"][5]
    code, out, err = run(capsys, "index", "add", "--gallery", folder, photo, "--key", "K7",
                         "--label", "renamed", "--meta", "price=2", *FAST)  # fmt: skip
    assert code == 0, err
    assert f"replacing item {old} (key 'K7')" in out
    assert "duplicate images" in err  # the same bytes as item 5
    with Gallery.open(folder) as gallery:
        assert len(gallery) == before and old not in gallery.ids
        (new,) = [row for row in gallery.all_items() if row["meta"].get("key") == "K7"]
        assert new["class_name"] == "renamed" and new["meta"]["price"] == 2.0  # a float column
    code, out, err = run(capsys, "index", "remove", "--gallery", folder, "--keys", "K8", "K9")
    assert code == 0, err
    code, _, err = run(capsys, "index", "remove", "--gallery", folder, "--keys", "nope")
    assert_one_line_error(code, err, "no item with key 'nope'")
    from nearsight.app.page.layout import build_app
    from nearsight.app.server_app import launch_app, stop_app

    demo = build_app([folder], device="cpu", analyse=False)
    url = launch_app(demo, server_settings()).rstrip("/")
    try:
        found = httpx.get(f"{url}/api/items/by-key/K7", timeout=30)
        assert found.status_code == 200 and found.json()["id"] == new["id"]
        assert httpx.get(f"{url}/api/items/by-key/K8", timeout=30).status_code == 404
        refused = httpx.post(f"{url}/api/search", data={"id": "0", "filter": "colour=red"})
        assert refused.status_code == 400 and "unknown filter key" in refused.text
        page = demo.nearsight  # the page shows the same message, not an empty grid
        grid, status, _ = page.item_grid(page.view(None).name, new["id"], 5, "colour=red")
        assert re.search("unknown filter key 'colour'.*shop", status)
        assert "ns-cell" not in grid and "the filter was not applied" in grid
    finally:
        stop_app(demo)


def test_repeated_keys_are_refused_and_duplicate_images_reported(shop, tmp_path, capsys):
    rows = _rows(shop, lambda n: [f"K{n // 2}"])
    manifest = _csv(tmp_path / "dup.csv", ["path", "label", "sku"], rows)
    code, _, err = _build(capsys, shop, manifest, tmp_path / "g", "--key-column", "sku")
    assert_one_line_error(code, err, "key column 'sku' repeats 36 keys")
    twice = _csv(tmp_path / "twice.csv", ["path", "label"], _rows(shop) + _rows(shop)[:3])
    code, _, err = _build(capsys, shop, twice, tmp_path / "twice")
    assert code == 0 and "note: 3 duplicate images (same bytes)" in err
    (note,) = [line for line in err.splitlines() if "duplicate images" in line]
    assert all(image.name in note for image in shop["images"][:3])  # its examples, one line
    keyed = _csv(tmp_path / "keyed.csv", ["path", "label", "key"], _rows(shop, lambda n: [n]))
    assert _build(capsys, shop, keyed, tmp_path / "keyed")[0] == 0
    code, _, err = run(capsys, "index", "add", "--gallery", tmp_path / "keyed",
                       *shop["images"][:2], "--meta", "key=K1", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "a key names one item")  # two items, one key: refused
    with Gallery.open(tmp_path / "keyed") as gallery:
        assert len(gallery) == 72


def test_split_auto_follows_the_datasets_own_split(tmp_path):
    from nearsight.data.datasets import load_dataset, resolve_split

    for name in ("cub", "cars", "sop"):
        assert resolve_split(name, tmp_path) == "test"
    split, plain = tmp_path / "split", tmp_path / "plain"
    write_synthetic(split, classes=4, per_class=2, size=32)  # train/ and test/, 2 classes each
    for class_folder in sorted(split.glob("*/*")):  # the same 4 classes without the split
        shutil.copytree(class_folder, plain / class_folder.name)
    assert resolve_split("folder", plain) == "all"
    assert len(load_dataset("folder", plain, "auto").samples) == 8
    assert resolve_split("folder", split) == "test"
    chosen = load_dataset("folder", split, "auto").samples
    assert len(chosen) == 4 and {sample.split for sample in chosen} == {"test"}


def test_add_declares_new_column_types_and_later_adds_follow(shop, catalog, tmp_path, capsys):
    folder = tmp_path / "typed"
    assert _build(capsys, shop, catalog["manifest"], folder)[0] == 0
    photo = shop["images"][0]
    code, _, err = run(capsys, "index", "add", "--gallery", folder, photo, "--meta", "size=010",
                       "--meta-types", "size=int", *FAST)  # fmt: skip
    assert code == 0, err
    code, _, err = run(capsys, "index", "add", "--gallery", folder, photo, "--meta", "size=020",
                       *FAST)  # fmt: skip
    assert code == 0, err
    with Gallery.open(folder) as gallery:
        assert gallery.meta["meta_types"]["size"] == "int"
        assert [row["meta"]["size"] for row in gallery.all_items()[-2:]] == [10, 20]
    code, out, _ = run(capsys, "search", "--gallery", folder, "--id", "0", "--k", "80",
                       "--filter", "size<15", "--json")  # fmt: skip
    assert code == 0 and [row["meta"]["size"] for row in json.loads(out)] == [10]
    code, _, err = run(capsys, "index", "add", "--gallery", folder, photo, "--meta-types",
                       "sku=int", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "the gallery's column 'sku' is str")


def test_add_maps_a_class_name_to_the_gallerys_label(shop, catalog, tmp_path, capsys):
    folder = tmp_path / "labels"
    assert _build(capsys, shop, catalog["manifest"], folder)[0] == 0
    with Gallery.open(folder) as gallery:
        known = gallery.items([10])[0]
        top = int(gallery.labels.max())
    photo = shop["images"][0]
    assert run(capsys, "index", "add", "--gallery", folder, photo, "--label",
               known["class_name"], *FAST)[0] == 0  # fmt: skip
    assert run(capsys, "index", "add", "--gallery", folder, photo, "--label", "brand-new",
               *FAST)[0] == 0  # fmt: skip
    with Gallery.open(folder) as gallery:
        added = gallery.all_items()[-2:]
    assert added[0]["label"] == known["label"] and added[0]["class_name"] == known["class_name"]
    assert added[1]["label"] == top + 1 and added[1]["class_name"] == "brand-new"


def test_column_types_and_label_codes():
    from nearsight.data.meta import (
        FilterError,
        infer_types,
        label_codes,
        parse_meta_types,
        typed_row,
    )

    rows = [{"sku": "430", "price": "2", "n": "1"}, {"sku": "091", "price": "2.5", "n": ""}]
    types = infer_types(rows)
    assert types == {"sku": "str", "price": "float", "n": "int"}
    assert [typed_row(r, types) for r in rows] == [
        {"sku": "430", "price": 2.0, "n": 1},
        {"sku": "091", "price": 2.5},
    ]
    declared = infer_types(rows, parse_meta_types(["sku=int", "price=str"]))
    assert typed_row(rows[1], declared) == {"sku": 91, "price": "2.5"}
    with pytest.raises(FilterError, match="declared int"):
        typed_row({"sku": "x1"}, {"sku": "int"})
    with pytest.raises(FilterError, match="COLUMN=TYPE"):
        parse_meta_types("sku=number")
    assert label_codes(["3", 1, "", None]) == ([3, 1, None, None], [None] * 4)
    assert label_codes(["c1", "c0", "", "c1"]) == ([1, 0, None, 1], ["c1", "c0", None, "c1"])
