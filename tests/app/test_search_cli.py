"""`nearsight search` for product galleries, end to end: metadata from a CSV manifest's extra
columns and `index add --meta`, `--filter`, `--id`, and batch search with `--queries`."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from helpers import FAST, assert_one_line_error, run

from nearsight.app.cli import main


@pytest.fixture(scope="module")
def product(product_once):
    """The session's product gallery (helpers.make_product): this module only reads it."""
    return product_once


def _search(capsys, *argv) -> list[dict]:
    code, out, err = run(capsys, "search", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_csv_columns_become_typed_meta_in_the_results(capsys, product):
    results = _search(capsys, "--gallery", product["gallery"], product["images"][3], "--k", 4)
    assert len(results) == 4 and results[0]["distance"] == pytest.approx(0, abs=1e-3)
    assert results[0]["meta"] == {"shop": "south", "price": 4.5, "sku": "0003"}
    assert all(set(row) == {"rank", "id", "key", "path", "label", "class_name", "distance", "meta"}
               for row in results)  # fmt: skip


def test_filtered_search_returns_exactly_k_matching_items(capsys, product):
    query = product["images"][0]
    k = 6
    results = _search(capsys, "--gallery", product["gallery"], query, "--k", k,
                      "--filter", "shop=south", "--filter", "price>=10", "--filter", "price<40")  # fmt: skip
    assert len(results) == k
    for row in results:
        assert row["meta"]["shop"] == "south" and 10 <= row["meta"]["price"] < 40
    # the true top-k of the matching items: an unfiltered search over all of them, filtered after
    everything = _search(capsys, "--gallery", product["gallery"], query, "--k", 36)
    matching = [r for r in everything
                if r["meta"]["shop"] == "south" and 10 <= r["meta"]["price"] < 40]  # fmt: skip
    assert [r["id"] for r in results] == [r["id"] for r in matching[:k]]


def test_search_by_id_and_by_vector(capsys, product, tmp_path):
    results = _search(capsys, "--gallery", product["gallery"], "--id", 5, "--k", 3)
    assert len(results) == 3 and results[0]["id"] == 5 and results[0]["distance"] < 1e-3
    shop = results[0]["meta"]["shop"]
    other = "north" if shop == "south" else "south"
    filtered = _search(capsys, "--gallery", product["gallery"], "--id", 5, "--filter",
                       f"shop={other}")  # fmt: skip
    assert 5 not in [r["id"] for r in filtered] and len(filtered) == 8
    from nearsight.index.gallery.core import Gallery

    with Gallery.open(product["gallery"]) as gallery:
        np.save(tmp_path / "q.npy", np.asarray(gallery.embeddings[5]) * 2)
    by_vector = _search(capsys, "--gallery", product["gallery"], "--vector", tmp_path / "q.npy",
                        "--k", 3)  # fmt: skip
    assert [r["id"] for r in by_vector] == [r["id"] for r in results]
    code, _, err = run(capsys, "search", "--gallery", product["gallery"], "--id", 999)
    assert_one_line_error(code, err, "no item with id 999")


def test_bad_filter_is_a_one_line_error(capsys, product):
    code, _, err = run(capsys, "search", "--gallery", product["gallery"], "--id", 1,
                       "--filter", "price>=cheap")  # fmt: skip
    assert_one_line_error(code, err, "needs a number")


def test_batch_search_writes_one_line_per_image_corrupt_ones_included(capsys, product, tmp_path):
    folder = tmp_path / "queries"
    (folder / "sub").mkdir(parents=True)
    for image in product["images"][:5]:
        (folder / "sub" / image.name).write_bytes(image.read_bytes())
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (folder / "notes.txt").write_text("not an image: not a query")
    out = tmp_path / "results.jsonl"
    code, _, err = run(capsys, "search", "--gallery", product["gallery"], "--queries", folder,
                       "--out", out, "--k", 3, "--filter", "shop=north", *FAST)  # fmt: skip
    assert code == 0, err
    assert "6 queries, 1 unreadable" in err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6
    assert [Path(line["query"]).name for line in lines][0] == "broken.png"
    assert "error" in lines[0] and "neighbours" not in lines[0]
    for line in lines[1:]:
        assert len(line["neighbours"]) == 3
        assert all(row["meta"]["shop"] == "north" for row in line["neighbours"])
    code, _, err = run(capsys, "search", "--gallery", product["gallery"], "--queries", folder)
    assert_one_line_error(code, err, "--queries and --out go together")


def test_index_add_meta_and_old_galleries(capsys, product, tmp_path):
    gallery = tmp_path / "gallery"
    code = main(["index", "build", "--model", str(product["model"]), "--images",
                 *map(str, product["images"][:4]), "--out", str(gallery), *FAST])  # fmt: skip
    assert code == 0
    with sqlite3.connect(gallery / "catalog.db") as conn:  # as built before metadata existed
        conn.execute("DROP TABLE item_meta")
    code, _, err = run(capsys, "index", "add", "--gallery", gallery, product["images"][5],
                       "--meta", "shop=west", "--meta", "price=12", *FAST)  # fmt: skip
    assert code == 0, err
    results = _search(capsys, "--gallery", gallery, product["images"][5], "--k", 5)
    assert results[0]["meta"] == {"shop": "west", "price": 12}
    assert [r["meta"] for r in results[1:]] == [{}] * 4
    found = _search(capsys, "--gallery", gallery, product["images"][0], "--filter", "price>11")
    assert [r["id"] for r in found] == [4]
    code, _, err = run(capsys, "index", "add", "--gallery", gallery, product["images"][6],
                       "--meta", "label=3")  # fmt: skip
    assert_one_line_error(code, err, "built-in")


def test_index_import_keeps_the_meta_files_extra_columns(capsys, tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((50, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.save(tmp_path / "vectors.npy", vectors)
    with open(tmp_path / "meta.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", "path", "shop", "price"])
        writer.writerows([i % 5, f"/items/{i}.jpg", "ab"[i % 2], i] for i in range(50))
    out = tmp_path / "g"
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "vectors.npy",
                       "--meta", tmp_path / "meta.csv", "--out", out)  # fmt: skip
    assert code == 0, err
    found = _search(capsys, "--gallery", out, "--id", 3, "--k", 5, "--filter", "shop=a",
                    "--filter", "price>=20")  # fmt: skip
    assert len(found) == 5
    assert all(r["meta"]["shop"] == "a" and r["meta"]["price"] >= 20 for r in found)
