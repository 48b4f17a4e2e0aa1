"""The notebook API (issue 23 item 5): search_many in batches with per-image errors, results
as DataFrames and as an HTML grid, Gallery.vector, and build/add/remove from Python."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.search.verdicts import FRAME_COLOURS


def _images(onnx_gallery) -> list[Path]:
    return sorted(onnx_gallery.data.rglob("*.png"))


def test_search_many_goes_on_past_an_unreadable_file(onnx_gallery, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    images = _images(onnx_gallery)[:4]
    queries = [images[0], broken, images[1], tmp_path / "missing.jpg", images[2], images[3]]
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        many = gallery.search_many(queries, k=3)
        alone = [gallery.search(image, k=3) for image in images]
        chunked = gallery.search_many(queries, k=3, batch_size=2)  # 3 batches, one all-error
    assert len(many) == 6
    assert sorted(many.errors) == [1, 3]
    assert "broken.png" in many.errors[1] and "missing.jpg" in many.errors[3]
    assert list(many[1]) == [] and many[1].error is not None
    good = [many[0], many[2], many[4], many[5]]
    assert [[hit["id"] for hit in r] for r in good] == [[hit["id"] for hit in r] for r in alone]
    for got, expected in zip(good, alone, strict=True):
        np.testing.assert_allclose(
            [hit["distance"] for hit in got], [hit["distance"] for hit in expected], atol=1e-5
        )
    assert [[h["id"] for h in r] for r in chunked] == [[h["id"] for h in r] for r in many]
    assert chunked.errors == many.errors


def test_search_of_a_list_points_to_search_many(onnx_gallery):
    images = _images(onnx_gallery)[:2]
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        with pytest.raises(NearsightError, match="use search_many") as caught:
            gallery.search(images, k=3)
        assert "\n" not in str(caught.value)
        with pytest.raises(NearsightError, match="use search_many"):
            gallery.search(np.zeros((2, 32, 32, 3), np.uint8))
        with pytest.raises(NearsightError, match="for one, use search"):
            gallery.search_many(images[0])
        # an array of images is a batch: one entry per image
        stack = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in images])
        by_array = gallery.search_many(stack, k=2)
        by_path = gallery.search_many(images, k=2)
    assert [[h["id"] for h in r] for r in by_array] == [[h["id"] for h in r] for r in by_path]


def test_vector_is_the_stored_embedding(onnx_gallery):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        item = int(gallery.gallery.ids[3])
        vector = gallery.vector(item)
        stored = np.asarray(gallery.gallery.embeddings[3])
        hits = gallery.search_vector(vector, k=1)
        with pytest.raises(NearsightError, match="no item with id 999"):
            gallery.vector(999)
    assert vector.shape == (8,) and vector.dtype == np.float32
    np.testing.assert_array_equal(vector, stored)
    assert hits[0]["id"] == item


def test_to_pandas_flattens_meta_into_columns(product):
    with nearsight.open_gallery(product["gallery"]) as gallery:
        hits = gallery.search_item(0, k=5)
    frame = hits.to_pandas()
    assert list(frame.columns[:7]) == [
        "rank",
        "id",
        "key",
        "path",
        "label",
        "class_name",
        "distance",
    ]
    assert {"shop", "price", "sku", "correct"} <= set(frame.columns)
    assert "meta" not in frame.columns and len(frame) == 5
    assert frame["rank"].tolist() == [1, 2, 3, 4, 5]
    for row, hit in zip(frame.to_dict("records"), hits, strict=True):
        assert {key: row[key] for key in hit["meta"]} == hit["meta"]
        assert row["correct"] == (hit["label"] == hits[0]["label"])
    assert frame["correct"].iloc[0]  # the item itself, first at distance 0


def test_results_list_to_pandas_has_a_query_and_an_error_column(onnx_gallery, tmp_path):
    images = _images(onnx_gallery)[:2]
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        many = gallery.search_many([images[0], tmp_path / "gone.png", images[1]], k=2)
    frame = many.to_pandas()
    assert frame["query"].tolist() == [0, 0, 1, 2, 2]
    assert frame["query_path"].tolist()[1:3] == [str(images[0]), str(tmp_path / "gone.png")]
    assert frame["error"].notna().tolist() == [False, False, True, False, False]
    assert "gone.png" in frame["error"].iloc[2]
    assert frame["id"].iloc[0] == many[0][0]["id"]


def test_to_pandas_without_pandas_says_what_to_install(onnx_gallery, monkeypatch):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        hits = gallery.search_item(int(gallery.gallery.ids[0]), k=2)
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now fails
    with pytest.raises(NearsightError, match="pip install pandas"):
        hits.to_pandas()


def test_html_grid_colours_and_inlines_thumbnails(onnx_gallery):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        rows = gallery.gallery.all_items()
        item = rows[0]
        hits = gallery.search_item(item["id"], k=6)
        unknown = gallery.search(Path(item["path"]), k=3)  # no query class: all grey
        labelled = gallery.search(Path(item["path"]), k=3, label=item["label"])
    page = hits._repr_html_()
    verdicts = re.findall(r'data-correct="(\w+)"', page)
    expected = ["true" if hit["label"] == item["label"] else "false" for hit in hits]
    assert verdicts == expected and "true" in verdicts and "false" in verdicts
    for verdict in set(verdicts):
        cells = re.findall(
            rf'data-correct="{verdict}"[^>]*style="[^"]*{FRAME_COLOURS[verdict]}', page
        )
        assert len(cells) == verdicts.count(verdict)
    # the query and every neighbour as an inline JPEG, nothing fetched by path
    assert page.count('src="data:image/jpeg;base64,') == 7
    assert 'src="/' not in page and "file://" not in page
    assert set(re.findall(r'data-correct="(\w+)"', unknown._repr_html_())) == {"unknown"}
    assert re.findall(r'data-correct="(\w+)"', labelled._repr_html_())[0] == "true"


def test_results_list_html_shows_errors_escaped(onnx_gallery, tmp_path):
    images = _images(onnx_gallery)[:1]
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        many = gallery.search_many([images[0], tmp_path / "<b>x</b>.png"], k=2)
    page = many._repr_html_()
    assert page.count('class="ns-results"') == 2
    assert "&lt;b&gt;x&lt;/b&gt;.png" in page and "<b>x</b>.png" not in page
    assert 'class="ns-error"' in page


def test_build_add_remove_from_python(onnx_gallery, tmp_path):
    out = tmp_path / "built"
    with nearsight.build_gallery(
        onnx_gallery.model, out, dataset="folder", root=onnx_gallery.data, split="all",
        index_type="hnsw", chunk_size=5,  # index build's flags, as typed keywords
    ) as gallery:  # fmt: skip
        assert gallery.gallery.index_type == "hnsw"
        assert gallery.build_report.items == 12 and gallery.build_report.chunks_embedded == 3
        assert len(gallery) == 12
        image = _images(onnx_gallery)[0]
        assert gallery.search(image, k=1)[0]["distance"] == pytest.approx(0, abs=1e-3)
        copy = tmp_path / "copy.png"
        shutil.copy(image, copy)
        ids = nearsight.add_images(gallery, [copy], label=7, meta={"shop": "north", "price": 3})
        assert len(ids) == 1 and len(gallery) == 13  # the open gallery sees it
        added = gallery.search(copy, k=2, filters="shop=north")
        assert [hit["id"] for hit in added] == ids
        assert added[0]["meta"] == {"shop": "north", "price": 3} and added[0]["label"] == 7
        nearsight.remove_items(out, ids)  # by folder: the open gallery needs a reload
        gallery.gallery.reload()
        assert len(gallery) == 12
        assert ids[0] not in [hit["id"] for hit in gallery.search(copy, k=12)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda g, m: nearsight.build_gallery(m, g / "x", images=[g / "a.png"], index_type="bogus"), "unknown index type 'bogus'"),
        (lambda g, m: nearsight.build_gallery(m, g / "x"), "a dataset (with its root) or images"),
        (lambda g, m: nearsight.remove_items(g / "nowhere", [1]), "no gallery at"),
        (lambda g, m: nearsight.add_images(g / "nowhere", []), "images is empty"),
    ],
)  # fmt: skip
def test_bad_calls_are_one_line_errors(onnx_gallery, tmp_path, call, message):
    with pytest.raises(NearsightError, match=re.escape(message)) as caught:
        call(tmp_path, onnx_gallery.model)
    assert "\n" not in str(caught.value)


def test_build_gallery_is_typed(onnx_gallery, tmp_path):
    with pytest.raises(TypeError, match="colour"):  # not a flag passed through: a typo fails
        nearsight.build_gallery(onnx_gallery.model, tmp_path / "x", images=[], colour="red")


def test_search_many_reranks_as_search_does(onnx_gallery, tmp_path):
    images = _images(onnx_gallery)[:3]
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        many = gallery.search_many(images, k=4, rerank="aqe:k=2")
        alone = [gallery.search(image, k=4, rerank="aqe:k=2") for image in images]
        plain = gallery.search_many(images, k=4, rerank="none")
        with pytest.raises(NearsightError):  # a bad spec fails at once, not per image
            gallery.search_many([tmp_path / "missing.png"], rerank="bogus")
    assert [[h["id"] for h in r] for r in many] == [[h["id"] for h in r] for r in alone]
    distances = [[round(h["distance"], 5) for h in r] for r in many]
    assert distances != [[round(h["distance"], 5) for h in r] for r in plain]


def test_keys_from_python(onnx_gallery, tmp_path):
    """The catalog's stable keys through the same wrappers: add with a key, replace it, remove
    by key."""
    images = _images(onnx_gallery)
    manifest = tmp_path / "catalog.csv"
    rows = ["path,label,key"] + [
        f"{path},{n % 2},sku-{n + 10}" for n, path in enumerate(images[:4])
    ]
    manifest.write_text("\n".join(rows) + "\n")
    out = tmp_path / "keyed"
    with nearsight.build_gallery(onnx_gallery.model, out, dataset="csv", root=manifest) as gallery:
        first = nearsight.add_images(gallery, [images[5]], key="sku-1")
        again = nearsight.add_images(gallery, [images[6]], key="sku-1")  # an upsert
        assert len(gallery) == 5 and first != again
        nearsight.remove_items(gallery, keys=["sku-1"])
        assert len(gallery) == 4
        with pytest.raises(NearsightError, match="ids or keys"):
            nearsight.remove_items(gallery, [1], keys=["x"])
