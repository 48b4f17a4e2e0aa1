"""The payload index (index/catalog/payload_file.py, payload_index.py, index/gallery/payload.py)
gives the SQL query's ids for every kind of condition: from its file, with items added after
it and items removed since, in a gallery through add, remove and compact, and for a gallery
built before it (built on its first open). A filtered search reads no SQL."""

from __future__ import annotations

import mmap
import sqlite3

import numpy as np
import pytest
from helpers.catalogs import conditions, random_catalog

from nearsight.data.meta import FilterError
from nearsight.index.catalog import filter_sql
from nearsight.index.catalog.column_filter import supported
from nearsight.index.catalog.filter_sql import budget, run_filter
from nearsight.index.catalog.filters import parse_filters
from nearsight.index.catalog.payload_file import (
    PayloadFileError,
    read_payload,
    read_snapshot,
    write_payload,
)
from nearsight.index.catalog.payload_index import PayloadIndex
from nearsight.index.catalog.store import CATALOG_FILE, Catalog
from nearsight.index.errors import GalleryError
from nearsight.index.gallery import payload as gallery_payload
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.payload import PAYLOAD_FILE
from nearsight.index.gallery.write import write_gallery

FILTERS = (["shop=north"], ["shop!=north"], ["shop="], ["shop!="], ["price<20"],
           ["price>=10", "price<=30"], ["shop=south", "price>25"], ["shop=west", "tag!=x"],
           ["tag=x", "shop!=east"], ["label=2"], ["label!=2", "price>=0"], ["added>=2025-03-01"],
           ["id>=5", "id<40"], ["tag=", "price<15"], ["shop!=north", "shop!=south"])  # fmt: skip


DATES = {"meta_types": {"added": "date"}}


def _sql(path, texts, catalog: Catalog) -> list[int]:
    from nearsight.index.catalog.filter_types import typed_conditions

    typed = typed_conditions(parse_filters(texts), catalog.column_types(), catalog.class_names())
    return run_filter(path, typed, catalog.has_item_meta(), 10.0).tolist()


def _mapped(array: np.ndarray) -> bool:
    base = array
    while base is not None:
        if isinstance(base, np.memmap | mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_payload_file_answers_as_the_sql_query(tmp_path, seed):
    rng = np.random.default_rng(seed)
    path = tmp_path / "catalog.db"
    random_catalog(path, rng, 400)
    conn = sqlite3.connect(path)
    try:
        write_payload(tmp_path / PAYLOAD_FILE, read_snapshot(conn))
    finally:
        conn.close()
    snapshot = read_payload(tmp_path / PAYLOAD_FILE)
    assert _mapped(snapshot.all_ids)  # read from the file's map, not copied
    index = PayloadIndex(snapshot, None, np.zeros(0, np.int64))
    for _ in range(300):
        wanted = conditions(rng)
        got = index.filter_ids(wanted, budget(10.0)[1])
        assert got.dtype == np.int64
        assert got.tolist() == run_filter(path, wanted, True, 10.0).tolist(), wanted


def test_added_and_removed_items_answer_as_the_sql_query(tmp_path):
    """The file of the first items, the later ones read after it, some of both removed."""
    rng = np.random.default_rng(5)
    path = tmp_path / "catalog.db"
    random_catalog(path, rng, 400)
    conn = sqlite3.connect(path)
    try:
        ids = [row[0] for row in conn.execute("SELECT id FROM items ORDER BY id")]
        cut = ids[250]
        with conn:  # the file as written when the catalog ended at ``cut``
            later = conn.execute("SELECT * FROM items WHERE id > ?", (cut,)).fetchall()
            meta = conn.execute("SELECT * FROM item_meta WHERE item_id > ?", (cut,)).fetchall()
            conn.execute("DELETE FROM items WHERE id > ?", (cut,))
            conn.execute("DELETE FROM item_meta WHERE item_id > ?", (cut,))
        write_payload(tmp_path / PAYLOAD_FILE, read_snapshot(conn))
        removed = [ids[3], ids[100], ids[300]]
        with conn:  # then items added after it, and three removed
            conn.executemany(f"INSERT INTO items VALUES ({', '.join('?' * 8)})", later)
            conn.executemany("INSERT INTO item_meta VALUES (?, ?, ?)", meta)
            conn.executemany("DELETE FROM items WHERE id = ?", [(i,) for i in removed])
            conn.executemany("DELETE FROM item_meta WHERE item_id = ?", [(i,) for i in removed])
        added = read_snapshot(conn, after=cut)
    finally:
        conn.close()
    assert added.all_ids.min() > cut
    index = PayloadIndex(read_payload(tmp_path / PAYLOAD_FILE), added, np.asarray(removed))
    for _ in range(300):
        wanted = conditions(rng)
        assert supported(wanted)
        got = index.filter_ids(wanted, budget(10.0)[1])
        assert got.tolist() == run_filter(path, wanted, True, 10.0).tolist(), wanted


def _items(count: int, rng: np.random.Generator) -> list[dict]:
    shops = ["north", "south", "east", "west"]
    out = []
    for i in range(count):
        meta: dict = {"price": round(float(rng.uniform(0, 40)), 2) if i % 9 else int(i % 40)}
        if i % 5:
            meta["shop"] = shops[int(rng.integers(0, 4))]
        if i % 3 == 0:
            meta["tag"] = "x" if i % 2 else "y"
        meta["added"] = f"2025-{1 + i % 12:02d}-01"
        out.append({"path": f"/img/{i}.jpg", "label": i % 4, "class_name": f"c{i % 4}",
                    "meta": meta})  # fmt: skip
    return out


def _vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, 16)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _check_answers(gallery: Gallery, monkeypatch) -> None:
    """Every filter: the payload's ids (no SQL: run_filter refuses) are the SQL query's."""
    path = gallery.path / CATALOG_FILE
    with Catalog.open(path, readonly=True) as catalog:
        wants = [_sql(path, texts, catalog) for texts in FILTERS]
        types = catalog.column_types()
    assert gallery.column_types() == types
    with monkeypatch.context() as patch:
        patch.setattr(filter_sql, "run_filter", _no_sql)
        patch.setattr("nearsight.index.catalog.store.run_filter", _no_sql)
        for texts, want in zip(FILTERS, wants, strict=True):
            assert gallery.filter_ids(texts).tolist() == want, texts


def _no_sql(*args, **kwargs):
    raise AssertionError("a filter ran in SQL")


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw"])
def test_a_gallery_keeps_its_payload_through_add_remove_and_compact(
    tmp_path, monkeypatch, index_type
):
    rng = np.random.default_rng(0)
    folder = write_gallery(tmp_path / "g", _vectors(300, 0), _items(300, rng), model_sha256="a" * 64,
                           index_type=index_type, meta=DATES)  # fmt: skip
    assert (folder / PAYLOAD_FILE).is_file()
    written = (folder / PAYLOAD_FILE).stat().st_mtime_ns
    with Gallery.open(folder) as gallery:
        _check_answers(gallery, monkeypatch)
        gallery.add(_vectors(40, 1), _items(40, rng))
        _check_answers(gallery, monkeypatch)
        assert gallery._payload.added is not None and len(gallery._payload.added.all_ids) == 40
        gallery.remove([2, 7, 305, 330])
        _check_answers(gallery, monkeypatch)
        if index_type != "hnsw":  # hnsw compacted at once: the file was written again
            assert (folder / PAYLOAD_FILE).stat().st_mtime_ns == written
        gallery.compact()
        assert gallery._payload.added is None and not len(gallery._payload.removed)
        _check_answers(gallery, monkeypatch)
    with Gallery.open(folder) as gallery:
        found = gallery.filter_ids(["shop=north"])
        assert not np.isin([2, 7, 305, 330], found).any()


def test_a_gallery_built_before_the_index_builds_it_on_first_open(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    folder = write_gallery(tmp_path / "g", _vectors(200, 0), _items(200, rng), model_sha256="a" * 64,
                           index_type="flat", meta=DATES)  # fmt: skip
    with Gallery.open(folder) as gallery:
        gallery.add(_vectors(20, 1), _items(20, rng))
        gallery.remove([0, 210])
        before = {str(texts): gallery.filter_ids(texts).tolist() for texts in FILTERS}
    (folder / PAYLOAD_FILE).unlink()  # as written before the payload index
    with Gallery.open(folder) as gallery:
        assert (folder / PAYLOAD_FILE).is_file()  # built and saved
        assert {str(texts): gallery.filter_ids(texts).tolist() for texts in FILTERS} == before
        _check_answers(gallery, monkeypatch)
    (folder / PAYLOAD_FILE).write_bytes(b"damaged")
    with Gallery.open(folder) as gallery:
        assert {str(texts): gallery.filter_ids(texts).tolist() for texts in FILTERS} == before
    with pytest.raises(PayloadFileError):
        read_payload(tmp_path / "missing.idx")


def test_a_gallery_it_cannot_write_keeps_its_built_index_in_memory(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    folder = write_gallery(tmp_path / "g", _vectors(100, 0), _items(100, rng), model_sha256="a" * 64,
                           index_type="flat", meta=DATES)  # fmt: skip
    (folder / PAYLOAD_FILE).unlink()

    def read_only(*args, **kwargs):
        raise PermissionError("read-only folder")

    monkeypatch.setattr("nearsight.index.gallery.payload.write_payload", read_only)
    with Gallery.open(folder) as gallery:
        assert not (folder / PAYLOAD_FILE).exists()
        assert gallery._payload is not None
        _check_answers(gallery, monkeypatch)


def test_value_notes_from_the_payload_match_the_catalogs(tmp_path):
    rng = np.random.default_rng(3)
    folder = write_gallery(tmp_path / "g", _vectors(100, 0), _items(100, rng), model_sha256="a" * 64,
                           index_type="flat", meta=DATES)  # fmt: skip
    with Gallery.open(folder) as gallery, Catalog.open(folder / CATALOG_FILE) as catalog:
        for texts in (["shop=North"], ["shop!=nort"], ["tag=z"], ["price<3"], ["shop=north"]):
            wanted = parse_filters(texts)
            assert gallery.filter_notes(wanted) == catalog.filter_notes(wanted)
        assert gallery.filter_notes(parse_filters(["shop=North"]))  # a note was made
        assert gallery.meta_keys() == catalog.meta_keys()


def _counted(rows: list[dict], key: str) -> dict:
    counts: dict = {}
    for row in rows:
        value = row[key] if key in ("label", "class_name") else row["meta"].get(key)
        if value is not None and not isinstance(value, float):
            counts[value] = counts.get(value, 0) + 1
    return counts


def test_facets_count_each_value_among_the_allowed_items(tmp_path):
    rng = np.random.default_rng(4)
    folder = write_gallery(tmp_path / "g", _vectors(200, 0), _items(200, rng), model_sha256="a" * 64,
                           index_type="flat", meta=DATES)  # fmt: skip
    keys = ["shop", "tag", "label", "class_name"]
    with Gallery.open(folder) as gallery:
        gallery.add(_vectors(30, 1), _items(30, rng))
        gallery.remove([1, 4, 215])
        for filters in (None, ["price<20"], ["shop!=north", "tag="], ["shop=nowhere"]):
            allowed = None if filters is None else set(gallery.filter_ids(filters).tolist())
            rows = [row for row in gallery.all_items() if allowed is None or row["id"] in allowed]
            want = {key: _counted(rows, key) for key in keys}
            assert gallery.facets(filters, keys) == want, filters
        assert set(gallery.facets()) == set(gallery.meta_keys())
        with pytest.raises(GalleryError, match="no column 'nope'"):
            gallery.facets(keys=["nope"])


def test_the_payload_filter_keeps_the_time_budget(tmp_path):
    rng = np.random.default_rng(6)
    folder = write_gallery(tmp_path / "g", _vectors(300, 0), _items(300, rng), model_sha256="a" * 64,
                           index_type="flat", meta=DATES)  # fmt: skip
    with Gallery.open(folder) as gallery:
        conditions = parse_filters(["shop!=north", "price<30", "tag="])
        with pytest.raises(FilterError, match="narrow it"):
            gallery_payload.filter_ids(gallery._payload, gallery._catalog, conditions,
                                       gallery.column_types(), time_limit_s=-1.0)  # fmt: skip


def test_an_ivf_gallery_knows_its_lists_before_its_first_filtered_search(tmp_path):
    """The plan's per-list counts of a filter need each id's list: read on open, not by the
    first filtered search."""
    rng = np.random.default_rng(7)
    folder = write_gallery(tmp_path / "g", _vectors(2000, 0), _items(2000, rng), model_sha256="a" * 64,
                           index_type="ivf", meta=DATES)  # fmt: skip
    with Gallery.open(folder) as gallery:
        assert gallery._filters.list_of is not None
        assert int(gallery._filters.list_sizes.sum()) == 2000


def _any_of(rng: np.random.Generator) -> list:
    """conditions() with some values replaced by any-ofs of two or three values."""
    out = []
    for condition in conditions(rng):
        if condition.op in ("=", "!=") and condition.value is not None and rng.random() < 0.6:
            # conditions() may draw an any-of itself: its values join the others
            others = [v for _ in range(int(rng.integers(1, 3))) for v in conditions(rng)[0].values]
            values = tuple(dict.fromkeys([*condition.values, *others]))
            condition = type(condition)(condition.key, condition.op, values)
        out.append(condition)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_any_of_filters_answer_as_the_sql_query(tmp_path, seed):
    rng = np.random.default_rng(seed + 10)
    path = tmp_path / "catalog.db"
    random_catalog(path, rng, 400)
    conn = sqlite3.connect(path)
    try:
        snapshot = read_snapshot(conn)
    finally:
        conn.close()
    index = PayloadIndex(snapshot, None, np.zeros(0, np.int64))
    tried = 0
    for _ in range(300):
        wanted = _any_of(rng)
        if not supported([one for c in wanted for one in c.alternatives()]):
            continue
        tried += 1
        got = index.filter_ids(wanted, budget(10.0)[1])
        assert got.tolist() == run_filter(path, wanted, True, 10.0).tolist(), wanted
    assert tried > 100


def test_any_of_through_a_gallery(tmp_path):
    rng = np.random.default_rng(8)
    folder = write_gallery(tmp_path / "g", _vectors(200, 0), _items(200, rng), model_sha256="a" * 64,
                           index_type="flat", meta=DATES)  # fmt: skip
    with Gallery.open(folder) as gallery:
        north = set(gallery.filter_ids(["shop=north"]).tolist())
        south = set(gallery.filter_ids(["shop=south"]).tolist())
        both = gallery.filter_ids(["shop=north|south"]).tolist()
        assert both == sorted(north | south)
        assert gallery.filter_ids(["shop!=north | south"]).tolist() == sorted(
            set(gallery.ids.tolist()) - north - south
        )
        assert gallery.filter_ids(parse_filters({"shop": ["north", "south"]})).tolist() == both
        assert gallery.filter_ids(["label=1|3", "shop=north|south"]).tolist() == [
            i for i in both if i % 4 in (1, 3)
        ]
        notes = gallery.filter_notes(parse_filters(["shop=north|nort"]))
        assert len(notes) == 1 and "'north'" in notes[0]
        assert not len(gallery.filter_ids([r"shop=north\|south"]))  # one value, with a bar
