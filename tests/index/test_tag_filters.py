"""Tag columns (``--list-column``): the filter engines (the SQL query, the payload file; the
column arrays of a bare catalog leave tag columns to SQL) answer every filter on a tag column
as a brute force over each item's set of tags does; facets count each tag; bad tag filters and cells are one-line errors."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from nearsight.core.errors import NearsightError
from nearsight.data.meta import FilterError
from nearsight.index.catalog.column_cache import ColumnCache
from nearsight.index.catalog.column_filter import evaluate, supported
from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.facets import column_facets
from nearsight.index.catalog.filter_sql import budget
from nearsight.index.catalog.filter_types import typed_conditions
from nearsight.index.catalog.filters import Condition, parse_filters
from nearsight.index.catalog.list_columns import stored_cell, tags_of
from nearsight.index.catalog.payload_file import read_payload, read_snapshot, write_payload
from nearsight.index.catalog.payload_index import PayloadIndex
from nearsight.index.catalog.store import Catalog

TAGS = ("red", "blue", "grün", "5", "a b")


def _catalog(path, rng: np.random.Generator, count: int) -> list[set[str]]:
    """Items with 0-3 tags of TAGS (ids with gaps) and a shop; each item's tags."""
    items, held = [], []
    for i in range(count):
        tags = list(rng.choice(TAGS, int(rng.integers(0, 4)), replace=False))
        meta = {"shop": str(rng.choice(["north", "south"]))}
        if tags:
            meta["tags"] = stored_cell(tags, "tags")
        items.append({"id": i * 2 + int(rng.integers(0, 2)), "path": f"{i}.jpg", "meta": meta})
        held.append(set(tags))
    create_catalog(path, items, {"dim": 4, "list_columns": ["tags"],
                                 "meta_types": {"tags": "str", "shop": "str"}})  # fmt: skip
    return held


def _filters(rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(int(rng.integers(1, 4))):
        if rng.random() < 0.2:
            out.append(f"shop={rng.choice(['north', 'south'])}")
            continue
        op = str(rng.choice(["=", "!="]))
        values = rng.choice([*TAGS, "nope"], int(rng.integers(0, 4)), replace=False)
        out.append(f"tags{op}{'|'.join(values)}")
    return out


def _brute(held: list[set[str]], shops: list[str], filters: list[str]) -> np.ndarray:
    keep = np.ones(len(held), bool)
    for text in filters:
        condition = parse_filters(text)[0]
        if condition.key == "shop":
            keep &= np.array([shop == condition.value for shop in shops])
            continue
        wanted = {str(v) for v in condition.values}
        if not wanted:  # tags= : no tags; tags!= : some
            has = np.array([bool(tags) for tags in held])
            keep &= ~has if condition.op == "=" else has
            continue
        hit = np.array([not wanted.isdisjoint(tags) for tags in held])
        keep &= hit if condition.op == "=" else ~hit
    return keep


@pytest.mark.parametrize("seed", [0, 1])
def test_every_engine_answers_tag_filters_as_sets(tmp_path, seed):
    rng = np.random.default_rng(seed)
    path = tmp_path / "catalog.db"
    held = _catalog(path, rng, 300)
    catalog = Catalog.open(path)
    rows = catalog.items()
    ids = np.array([row["id"] for row in rows])
    shops = [row["meta"]["shop"] for row in rows]
    conn = sqlite3.connect(path)
    try:
        write_payload(tmp_path / "payload", read_snapshot(conn))
    finally:
        conn.close()
    payload = PayloadIndex(read_payload(tmp_path / "payload"), None, np.zeros(0, np.int64))
    cache = ColumnCache(path, build_after=1, background=False)
    types = catalog.column_types()
    for _ in range(150):
        filters = _filters(rng)
        want = ids[_brute(held, shops, filters)].tolist()
        typed = typed_conditions(parse_filters(filters), types, {}, ["tags"])
        assert supported(typed)
        assert catalog.filter_ids(parse_filters(filters)).tolist() == want, filters  # SQL
        if not any(c.key == "tags" for c in typed):  # the arrays leave tag columns to SQL
            snapshot = cache.snapshot(["shop"])
            assert evaluate(typed, snapshot, budget(10.0)[1]).tolist() == want, filters
        assert payload.filter_ids(typed, budget(10.0)[1]).tolist() == want, filters  # file
    found = column_facets(payload, None, types, top=10).as_dict()
    column = next(c for c in found["columns"] if c["key"] == "tags")
    counts = {v["value"]: v["count"] for v in column["values"]}
    assert counts == {t: sum(t in tags for tags in held) for t in TAGS if any(t in h for h in held)}
    assert column["missing"] == sum(not tags for tags in held)
    catalog.close()


def test_tag_notes_name_the_closest_tags(tmp_path):
    rng = np.random.default_rng(4)
    path = tmp_path / "catalog.db"
    _catalog(path, rng, 60)
    catalog = Catalog.open(path)
    notes = catalog.filter_notes(parse_filters("tags=Red|blue"))
    assert len(notes) == 1 and "'red'" in notes[0], notes
    catalog.close()


def test_bad_tag_filters_and_cells_are_one_line_errors():
    with pytest.raises(FilterError, match="tag column"):
        typed_conditions([Condition("tags", ">=", "red")], {"tags": "str"}, {}, ["tags"])
    with pytest.raises(NearsightError, match="may not hold"):
        stored_cell(["red", "a|b"], "tags")
    assert tags_of(" red| blue |red||", "tags") == ["red", "blue"]
    assert stored_cell([], "tags") is None and stored_cell("", "tags") is None


def test_parquet_list_cells_become_tags(tmp_path, monkeypatch, capsys):
    """A Parquet list column imported with --list-column (pyarrow stood in by its reader's
    answer: the rows as to_pylist gives them)."""
    import sys
    import types

    from helpers import run

    from nearsight.index.gallery.core import Gallery

    rows = [{"label": 0, "tags": ["red", "blue"]}, {"label": 1, "tags": []},
            {"label": 0, "tags": ["5", None]}]  # fmt: skip
    table = types.SimpleNamespace(to_pylist=lambda: [dict(row) for row in rows])
    parquet = types.ModuleType("pyarrow.parquet")
    parquet.read_table = lambda file: table  # type: ignore[attr-defined]
    arrow = types.ModuleType("pyarrow")
    arrow.parquet = parquet  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyarrow", arrow)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", parquet)
    (tmp_path / "meta.parquet").write_bytes(b"stand-in")
    np.save(tmp_path / "v.npy", np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "v.npy", "--meta",
                       tmp_path / "meta.parquet", "--out", tmp_path / "g", "--list-column", "tags")  # fmt: skip
    assert code == 0, err
    with Gallery.open(tmp_path / "g") as gallery:
        assert gallery.filter_ids("tags=red").tolist() == [0]
        assert gallery.filter_ids("tags=5|blue").tolist() == [0, 2]
        assert gallery.filter_ids("tags=").tolist() == [1]
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "v.npy", "--meta",
                       tmp_path / "meta.parquet", "--out", tmp_path / "h", "--list-column", "tag")  # fmt: skip
    assert code == 2 and "no such column" in err and len(err.strip().splitlines()) == 1
