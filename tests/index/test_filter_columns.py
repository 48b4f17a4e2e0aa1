"""Filters evaluated on the catalog's column arrays (index/catalog/columns.py, column_read.py,
column_cache.py, column_filter.py) give the SQL query's ids for every kind of condition, on
random catalogs with mixed-type columns, and never serve the ids of an older version of the
file."""

from __future__ import annotations

import os
import shutil
import sqlite3

import numpy as np
import pytest
from helpers.catalogs import conditions as _conditions
from helpers.catalogs import random_catalog as _random_catalog

from nearsight.data.meta import FilterError
from nearsight.index.catalog import column_cache, column_read
from nearsight.index.catalog.column_cache import ColumnCache
from nearsight.index.catalog.column_filter import evaluate, supported
from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.filter_sql import budget, run_filter
from nearsight.index.catalog.filters import Condition, parse_filters
from nearsight.index.catalog.store import Catalog


@pytest.mark.parametrize("seed, chunk", [(0, 131_072), (1, 131_072), (2, 7), (3, 7)])
def test_column_arrays_answer_as_the_sql_query(tmp_path, monkeypatch, seed, chunk):
    """``chunk``: rows per read transaction (7: every column read in many, text values
    repeated across their edges)."""
    monkeypatch.setattr(column_read, "CHUNK_ROWS", chunk)
    rng = np.random.default_rng(seed)
    path = tmp_path / "catalog.db"
    _random_catalog(path, rng, 400)
    cache = ColumnCache(path, build_after=1, background=False)
    for _ in range(300):
        conditions = _conditions(rng)
        assert supported(conditions), conditions
        snapshot = cache.snapshot(list(dict.fromkeys(c.key for c in conditions)))
        assert snapshot is not None
        got = evaluate(conditions, snapshot, budget(10.0)[1])
        want = run_filter(path, conditions, True, 10.0)
        assert got.dtype == np.int64
        assert got.tolist() == want.tolist(), conditions


def test_a_catalog_without_item_meta_answers_as_the_sql_query(tmp_path):
    path = tmp_path / "catalog.db"
    create_catalog(path, [{"path": f"{i}.jpg", "label": i % 3} for i in range(20)], {"dim": 4})
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE item_meta")
    conn.close()
    cache = ColumnCache(path, build_after=1, background=False)
    for condition in (Condition("shop", "=", "x"), Condition("shop", "!=", "x"),
                      Condition("shop", "=", None), Condition("shop", "!=", None),
                      Condition("price", "<", 3), Condition("label", "=", 1)):  # fmt: skip
        snapshot = cache.snapshot([condition.key, "id"])
        got = evaluate([condition, Condition("id", "<", 15)], snapshot, budget(10.0)[1])
        want = run_filter(path, [condition, Condition("id", "<", 15)], False, 10.0)
        assert got.tolist() == want.tolist(), condition


def test_a_column_holding_blobs_is_left_to_sql(tmp_path):
    """No nearsight write stores a blob; a catalog some tool wrote one into is answered by
    SQL (an item with a blob has a value: not in ``KEY=``)."""
    path = tmp_path / "catalog.db"
    _catalog(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE item_meta SET value = x'00' WHERE key = 'shop' AND item_id = 4")
    conn.close()
    with Catalog.open(path, readonly=True) as catalog:
        for texts in (["shop="], ["shop!="], ["price<3"]):
            for _ in range(column_cache.BUILD_AFTER_USES + 1):
                assert catalog.filter_ids(parse_filters(texts)).tolist() == _expected(
                    catalog, texts
                )
                catalog._columns.wait()
        assert 4 not in catalog.filter_ids(parse_filters(["shop="])).tolist()
        assert catalog._columns._snapshot is None  # the version was marked unreadable


def test_values_sqlite_would_convert_are_left_to_sql():
    assert not supported([Condition("label", "=", "3")])  # INTEGER affinity: '3' -> 3
    assert not supported([Condition("split", "=", 3)])  # TEXT affinity: 3 -> '3'
    assert not supported([Condition("n", "=", float("nan"))])
    assert not supported([Condition("n", "=", "\ud800")])  # not UTF-8
    assert supported([Condition("n", ">=", 3), Condition("t", "=", "x"), Condition("t", "=", None)])


def _catalog(path, count: int = 50) -> None:
    items = [{"path": f"{i}.jpg", "label": i % 5, "meta": {"price": i % 10, "shop": f"s{i % 3}"}}
             for i in range(count)]  # fmt: skip
    create_catalog(path, items, {"dim": 4})


def _expected(catalog: Catalog, texts: list[str]) -> list[int]:
    from nearsight.index.catalog.filter_types import typed_conditions

    typed = typed_conditions(parse_filters(texts), catalog.column_types(), catalog.class_names())
    return run_filter(catalog.path, typed, True, 10.0).tolist()


def test_filter_ids_uses_the_arrays_from_a_columns_second_filter(tmp_path):
    path = tmp_path / "catalog.db"
    _catalog(path)
    texts = ["price>=3", "price<6", "shop!=s1"]
    with Catalog.open(path, readonly=True) as catalog:
        filters = parse_filters(texts)
        first = catalog.filter_ids(filters)  # SQL: a one-off search reads no whole column
        catalog._columns.wait()
        assert catalog._columns._snapshot is None
        second = catalog.filter_ids(filters)  # SQL, while a thread reads the columns
        catalog._columns.wait()
        assert set(catalog._columns._snapshot.columns) == {"price", "shop"}
        third = catalog.filter_ids(filters)
        assert first.tolist() == second.tolist() == third.tolist() == _expected(catalog, texts)
        with pytest.raises(FilterError, match="took longer than"):
            catalog.filter_ids(filters, time_limit_s=0.0)


def _warm(catalog: Catalog, texts: list[str]) -> None:
    """Filter until the arrays of the catalog's version hold the keys of ``texts``."""
    for _ in range(column_cache.BUILD_AFTER_USES):
        catalog.filter_ids(parse_filters(texts))
        catalog._columns.wait()
    assert catalog._columns.snapshot([parse_filters(t)[0].key for t in texts]) is not None


@pytest.mark.parametrize("change", ["add", "remove", "update", "replace"])
def test_a_changed_catalog_is_never_answered_from_older_arrays(tmp_path, change):
    """The served catalog object keeps its arrays while another writer (``index add``,
    ``index remove``, a tool's UPDATE, a new file moved in place) changes the file: the next
    filter sees the change."""
    path = tmp_path / "catalog.db"
    _catalog(path)
    texts = ["price>=3", "shop=s1"]
    with Catalog.open(path, readonly=True) as served:
        _warm(served, texts)
        before = served.filter_ids(parse_filters(texts)).tolist()
        if change in ("add", "remove"):
            with Catalog.open(path) as writer:  # the CLI's own write path
                if change == "add":
                    writer.add_items([{"path": "new.jpg", "meta": {"price": 5, "shop": "s1"}}])
                else:
                    writer.remove([before[0]])
        elif change == "update":  # in place: the file keeps its size
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE item_meta SET value = 0 WHERE key = 'price' AND item_id = ?",
                             (before[-1],))  # fmt: skip
            conn.close()
        else:
            other = tmp_path / "other.db"
            shutil.copy(path, other)
            with sqlite3.connect(other) as conn:
                conn.execute("DELETE FROM item_meta WHERE item_id = ?", (before[1],))
            conn.close()
            os.replace(other, path)
        after = served.filter_ids(parse_filters(texts)).tolist()
        assert after == _expected(served, texts) != before
        _warm(served, texts)  # the new version's arrays
        assert served.filter_ids(parse_filters(texts)).tolist() == after


def test_a_write_between_two_chunks_of_a_read_discards_it(tmp_path, monkeypatch):
    """A column is read in short transactions (a writer waits for one at most); a write
    that commits between two of them makes the read worthless: nothing is kept from it, and
    the next read is of the new version."""
    monkeypatch.setattr(column_read, "CHUNK_ROWS", 5)
    path = tmp_path / "catalog.db"
    _catalog(path)
    chunk, calls = column_read.VersionedReader.chunk, []

    def write_on_the_third(reader, read):
        calls.append(1)
        if len(calls) == 3:
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE item_meta SET value = 99 WHERE key = 'price' AND item_id = 7")
            conn.close()
        return chunk(reader, read)

    monkeypatch.setattr(column_read.VersionedReader, "chunk", write_on_the_third)
    cache = ColumnCache(path, build_after=1, background=False)
    assert cache.snapshot(["price"]) is None and len(calls) == 3  # stopped at the change
    snapshot = cache.snapshot(["price"])
    conditions = [Condition("price", ">=", 9)]
    assert (
        evaluate(conditions, snapshot, budget(10.0)[1]).tolist()
        == run_filter(path, conditions, True, 10.0).tolist()
    )
    assert 7 in run_filter(path, conditions, True, 10.0).tolist()


def test_a_catalog_in_wal_mode_is_not_cached(tmp_path):
    """WAL mode keeps no change counter in the file: such a catalog is always asked in SQL."""
    path = tmp_path / "catalog.db"
    _catalog(path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    with Catalog.open(path, readonly=True) as catalog:
        for _ in range(3):
            assert catalog.filter_ids(parse_filters(["price<2"])).tolist() == _expected(
                catalog, ["price<2"]
            )
            catalog._columns.wait()
        assert catalog._columns._snapshot is None
