"""The gallery catalog and its folder (nearsight/index/gallery/files.py): round trips, stable ids, damaged
files, and all-or-nothing writes."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.store import CATALOG_FILE, Catalog, GalleryError
from nearsight.index.gallery.files import gallery_writer, open_catalog_dir, write_catalog_dir

META = {"model_sha256": "ab" * 32, "dim": 128, "metric": "inner_product", "index_type": "flat"}


def _items(count: int, start_label: int = 0) -> list[dict]:
    return [
        {
            "path": f"/data/img_{index:03d}.jpg",
            "label": None if index % 4 == 3 else start_label + index % 3,
            "class_name": None if index % 4 == 3 else f"class{index % 3}",
            "split": "test",
            "sha256": f"{index:064x}",
            "width": 10 + index,
            "height": 20,
        }
        for index in range(count)
    ]


def test_create_open_round_trip(tmp_path):
    gallery = write_catalog_dir(tmp_path / "gallery", _items(8), META)
    assert sorted(path.name for path in gallery.iterdir()) == [CATALOG_FILE]
    with open_catalog_dir(gallery) as catalog:
        assert catalog.count() == 8
        meta = catalog.meta()
        assert {key: meta[key] for key in META} == META  # types survive (dim is an int)
        assert isinstance(meta["created"], str) and meta["created"].endswith("+00:00")
        items = catalog.items()
        assert [item["id"] for item in items] == list(range(8))
        assert items[5] == {"id": 5, **_items(8)[5], "meta": {}}
        assert catalog.get(3)["label"] is None and catalog.get(99) is None
        assert [item["id"] for item in catalog.items([6, 1, 99, 1])] == [1, 6]
        ids, labels = catalog.labels()
        assert ids.dtype == labels.dtype == np.int64
        np.testing.assert_array_equal(labels, [0, 1, 2, -1, 1, 2, 0, -1])
        catalog.set_meta(dim=64, note={"k": [1, 2]})
        assert catalog.meta()["dim"] == 64 and catalog.meta()["note"] == {"k": [1, 2]}


def test_columns_are_typed_and_label_is_indexed(tmp_path):
    path = tmp_path / CATALOG_FILE
    create_catalog(path, _items(2), META)
    conn = sqlite3.connect(path)
    columns = {row[1]: row[2] for row in conn.execute("PRAGMA table_info(items)")}
    assert columns == {"id": "INTEGER", "path": "TEXT", "label": "INTEGER", "class_name": "TEXT",
                       "split": "TEXT", "sha256": "TEXT", "width": "INTEGER", "height": "INTEGER"}  # fmt: skip
    index_names = [row[1] for row in conn.execute("PRAGMA index_list(items)")]
    indexed = [
        [row[2] for row in conn.execute(f"PRAGMA index_info('{name}')")] for name in index_names
    ]
    assert ["label"] in indexed
    conn.close()


def test_add_and_remove_keep_ids_stable(tmp_path):
    path = tmp_path / CATALOG_FILE
    create_catalog(path, _items(4), META)
    with Catalog.open(path) as catalog:
        new = [{"path": "/new/a.png", "label": 7}, {"path": "/new/b.png"}]
        assert catalog.add_items(new) == [4, 5]
        catalog.remove([1, 5])
        assert [item["id"] for item in catalog.items()] == [0, 2, 3, 4]
        # The removed highest id (5) is not handed out again.
        assert catalog.add_items([{"path": "/new/c.png"}]) == [6]
        with pytest.raises(GalleryError, match="no item with id 1, 42"):
            catalog.remove([0, 1, 42])
        assert catalog.count() == 5  # all or nothing: 0 is still there
    with Catalog.open(path) as catalog:  # and it was all committed
        assert [item["id"] for item in catalog.items()] == [0, 2, 3, 4, 6]
        assert catalog.get(4) == {"id": 4, "path": "/new/a.png", "label": 7, "class_name": None,
                                  "split": None, "sha256": None, "width": None, "height": None, "meta": {}}  # fmt: skip


def test_given_ids_are_kept_and_bad_items_refused(tmp_path):
    create_catalog(tmp_path / "a.db", [{"id": 10, "path": "x"}, {"id": 3, "path": "y"}], {})
    with Catalog.open(tmp_path / "a.db") as catalog:
        assert [item["id"] for item in catalog.items()] == [3, 10]
        assert catalog.add_items([{"path": "z"}]) == [11]
    with pytest.raises(ValueError, match="unknown catalog item fields: colour"):
        create_catalog(tmp_path / "b.db", [{"path": "x", "colour": "red"}], {})
    with pytest.raises(ValueError, match="duplicate"):
        create_catalog(tmp_path / "c.db", [{"id": 1, "path": "x"}, {"id": 1, "path": "y"}], {})
    assert not (tmp_path / "c.db").exists()
    with pytest.raises(GalleryError, match="already exists"):
        create_catalog(tmp_path / "a.db", [], {})


def test_garbage_and_truncated_catalogs(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(GalleryError, match="not a SQLite database"):
        Catalog.open(garbage)

    truncated = tmp_path / "truncated.db"
    create_catalog(truncated, _items(1000), META)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(GalleryError) as error:
        Catalog.open(truncated)
    assert str(truncated) in str(error.value) and "\n" not in str(error.value)

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(GalleryError, match="no 'items' table"):
        Catalog.open(empty)
    with pytest.raises(GalleryError, match="no gallery catalog at"):
        Catalog.open(tmp_path / "absent.db")


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("DROP TABLE meta", "no 'meta' table"),
        ("ALTER TABLE items DROP COLUMN sha256", "table 'items' has no 'sha256' column"),
    ],
)
def test_missing_table_or_column(tmp_path, statement, message):
    path = tmp_path / CATALOG_FILE
    create_catalog(path, _items(2), META)
    conn = sqlite3.connect(path)
    conn.execute(statement)
    conn.commit()
    conn.close()
    with pytest.raises(GalleryError, match=message):
        Catalog.open(path)


def test_open_catalog_dir_errors(tmp_path):
    with pytest.raises(GalleryError, match=f"not a nearsight gallery: {tmp_path / 'none'} has no"):
        open_catalog_dir(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GalleryError, match="has no catalog.db"):
        open_catalog_dir(tmp_path / "empty")


def test_readonly_catalog_refuses_writes(tmp_path):
    gallery = write_catalog_dir(tmp_path / "g", _items(3), META)
    with open_catalog_dir(gallery, readonly=True) as catalog:
        assert catalog.count() == 3
        with pytest.raises(GalleryError, match="cannot be written"):
            catalog.set_meta(dim=1)


def test_a_catalog_can_be_used_from_other_threads(tmp_path):
    # The page opens a gallery once and searches it from request threads.
    gallery = write_catalog_dir(tmp_path / "g", _items(6), META)
    with open_catalog_dir(gallery) as catalog, ThreadPoolExecutor(max_workers=4) as pool:
        counts = list(pool.map(lambda _: (catalog.count(), len(catalog.items([1, 2]))), range(20)))
    assert counts == [(6, 2)] * 20


def test_crash_inside_the_writer_keeps_the_previous_gallery(tmp_path):
    gallery = write_catalog_dir(tmp_path / "g", _items(3), META)
    before = (gallery / CATALOG_FILE).read_bytes()
    with pytest.raises(RuntimeError, match="embedding failed"), gallery_writer(gallery) as tmp:
        create_catalog(tmp / CATALOG_FILE, _items(9), META)
        (tmp / "embeddings.npy").write_bytes(b"half")
        raise RuntimeError("embedding failed")
    assert (gallery / CATALOG_FILE).read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["g"]  # no temp folders left
    with open_catalog_dir(gallery) as catalog:
        assert catalog.count() == 3


def test_writer_replaces_a_gallery_with_extra_files(tmp_path):
    gallery = write_catalog_dir(tmp_path / "g", _items(3), META)
    with gallery_writer(gallery) as tmp:
        create_catalog(tmp / CATALOG_FILE, _items(5), META)
        (tmp / "index.faiss").write_bytes(b"faiss")
    assert sorted(path.name for path in gallery.iterdir()) == [CATALOG_FILE, "index.faiss"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["g"]
    with open_catalog_dir(gallery) as catalog:
        assert catalog.count() == 5


def test_writer_refuses_a_folder_that_is_not_a_gallery(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(GalleryError, match="not a nearsight gallery"):
        write_catalog_dir(photos, _items(1), META)
    assert (photos / "cat.jpg").read_bytes() == b"meow"


def test_open_recovers_from_a_crash_between_renames(tmp_path):
    gallery = write_catalog_dir(tmp_path / "g", _items(2), META)
    previous = tmp_path / ".g.previous"  # models.atomic's name for the folder renamed aside
    gallery.rename(previous)
    with open_catalog_dir(tmp_path / "g") as catalog:
        assert catalog.count() == 2
    assert not previous.exists() and Path(tmp_path / "g" / CATALOG_FILE).is_file()
