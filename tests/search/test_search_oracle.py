"""The search oracle: generated shop catalogs, searched through every route (the Python API, the
CLI's ``--json``, REST on a real server, the page's handler) on every index type, with filters
of every operator (any-of ``A|B`` and a tag column included) and re-ranking off and on, against a
float64 brute force on the same catalog.

The catalogs mix what broke before: a text column of number-looking codes with and without
leading zeros, prices, unicode shop names, empty values, class names as labels, unlabelled
items and byte-identical duplicate vectors. The brute force reads each filter value by its
column's type as a user expects (a text column compares text; a range on it is an error; a class
name resolves to its label; an unknown name is an error).

Every other gallery written is searched as one built before the payload index (its file
removed: the first open builds it from the catalog).

Checked for every query: all routes agree (ids and distances) or all refuse; a page
(``offset``) is the longer search's ranks after the offset; the answer holds
``min(k, matches)`` items, every one matching; the distances are the exact float64 ones; a
query by id gets the item first at distance 0 when it matches. Without re-ranking: the exact
top-k on flat, recall@k >= 0.9 on the approximate types. A larger sweep: bench/search_oracle.py.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import running_page
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from nearsight.app.cli import main
from nearsight.core.errors import NearsightError
from nearsight.index.gallery.payload import PAYLOAD_FILE
from nearsight.search.searcher import open_gallery

INDEX_TYPES = ("flat", "ivf", "hnsw", "ivfpq", "opq")
ITEMS, DIM, K_MAX = 300, 8, 12
SHOPS = ("north", "süd", "東京", "o'hara", "west end")
NAMES = ("red-shoe", "blue-bag", "green hat", "ünïcode", "42x", "bag")
TAGS = ("red", "blue", "grün", "5")  # a tag column: each item holds 0-3 of them
RERANK = "dba+aqe:k=2,alpha=3,depth=30"
RANGES = (">=", ">", "<=", "<")
# catalogs per run: a few in make test; bench/search_oracle.py sweeps more
EXAMPLES = int(os.environ.get("NEARSIGHT_ORACLE_EXAMPLES", "4"))


@dataclass
class Catalog:
    vectors: np.ndarray  # float32 [N, D], unit
    rows: list[dict[str, str]]  # the CSV's cells ("" empty)
    types: dict[str, str] = field(default_factory=dict)  # column -> int | float | str


@st.composite
def catalogs(draw) -> Catalog:
    """A shop catalog: shape chosen by hypothesis, values by a seeded generator."""
    seed = draw(st.integers(0, 2**32 - 1))
    codes = draw(st.lists(st.from_regex(r"0?[1-9][0-9]{0,3}", fullmatch=True), min_size=2,
                          max_size=6, unique=True))  # fmt: skip
    classes = draw(st.integers(2, len(NAMES)))
    unlabelled = draw(st.sampled_from((0.0, 0.1, 0.3)))
    empty = draw(st.sampled_from((0.0, 0.1)))
    rng = np.random.default_rng(seed)
    names = NAMES[:classes]
    centres = rng.normal(size=(classes, DIM))
    labels = rng.integers(0, classes, ITEMS)
    vectors = centres[labels] + 0.8 * rng.normal(size=(ITEMS, DIM))
    for copy in rng.choice(ITEMS, 6, replace=False)[:3]:  # byte-identical duplicates
        vectors[(copy + 1) % ITEMS] = vectors[copy]
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)

    def cell(values) -> str:
        return "" if rng.random() < empty else str(values[rng.integers(len(values))])

    rows = [
        {
            "label": "" if rng.random() < unlabelled else names[labels[i]],
            "sku": cell(codes),
            "price": cell([1.5, 2.0, 9.99, 20.0, 35.25]),
            "shop": cell(SHOPS),
            "tags": "|".join(rng.choice(TAGS, rng.integers(0, 4), replace=False)),
        }
        for i in range(ITEMS)
    ]
    catalog = Catalog(vectors, rows)
    catalog.types = {column: _column_type([r[column] for r in rows if r[column]])
                     for column in ("sku", "price", "shop")}  # fmt: skip
    return catalog


def _column_type(values: list[str]) -> str:
    """A column's type as a user reads a CSV: numbers only when every value is one, and a
    leading zero makes a code (text)."""
    if all(re.fullmatch(r"-?(0|[1-9]\d*)", v) for v in values):
        return "int"
    if all(re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", v) for v in values):
        return "float"
    return "str"


@st.composite
def queries(draw, catalog: Catalog) -> dict:
    """A query (an item by id, or a vector), k, 0-2 filter conditions and re-ranking."""
    conditions = []
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(("sku", "price", "shop", "label", "class_name", "tags")))
        op = draw(st.sampled_from(("=", "!=", *RANGES)))
        pool = [row["label" if key == "class_name" else key] for row in catalog.rows]
        if key == "tags":
            pool = [tag for cell in pool for tag in cell.split("|")]
        pool = [value for value in pool if value] or ["none"]
        choices = [*sorted(set(pool)), "nope", "7"]
        value = draw(st.sampled_from(choices))
        if op in ("=", "!=") and draw(st.booleans()):  # any of: A|B
            value = f"{value}|{draw(st.sampled_from(choices))}"
        conditions.append(f"{key}{op}{value}")
    by_id = draw(st.booleans())
    return {
        "id": draw(st.integers(0, ITEMS - 1)) if by_id else None,
        "vector_seed": None if by_id else draw(st.integers(0, 1000)),
        "k": draw(st.integers(1, K_MAX)),
        "filters": conditions,
        "rerank": draw(st.booleans()),
        "offset": draw(st.sampled_from((0, 0, 2, 7))),  # a page: ranks offset+1...
    }


# -- the brute force -------------------------------------------------------------------------


class Refused(Exception):
    """The brute force's verdict that a filter is an error, not an empty answer."""


def matches(catalog: Catalog, conditions: list[str]) -> np.ndarray:
    """The ids meeting every condition, read as a user expects (module docstring)."""
    keep = np.ones(ITEMS, dtype=bool)
    for text in conditions:
        key, op, value = re.fullmatch(r"(\w+)(>=|<=|!=|>|<|=)(.*)", text).groups()
        each = [_matches_one(catalog, text, key, op, one) for one in value.split("|")]
        # any of: an item holding one of the values; != of several: holding none of them
        keep &= np.logical_or.reduce(each) if op == "=" else np.logical_and.reduce(each)
    return np.flatnonzero(keep)


def _matches_one(catalog: Catalog, text: str, key: str, op: str, value: str) -> np.ndarray:
    """Which items meet ``key op value`` (one value)."""
    names = sorted({row["label"] for row in catalog.rows if row["label"]})
    if key == "tags":  # a set of tags: = holds when the item has the tag, != when it has not
        if op in RANGES:
            raise Refused(text)
        held = np.array([value in row["tags"].split("|") for row in catalog.rows])
        return held if op == "=" else ~held
    if op in RANGES and not re.fullmatch(r"-?\d+(\.\d+)?", value):
        raise Refused(text)  # a range needs a number, whatever the column
    number = re.fullmatch(r"-?\d+(\.\d+)?", value) is not None
    if key == "label" and number:  # a label number: names are numbered in sorted order
        cells = [str(names.index(row["label"])) if row["label"] else "" for row in catalog.rows]
        return np.array([_holds(cell, op, value, "", catalog, numeric=True) for cell in cells])
    if key in ("label", "class_name"):
        if op in RANGES or value not in names:
            raise Refused(text)  # "7" and "nope" are not class names here
        cells = [row["label"] for row in catalog.rows]
    else:
        cells = [row[key] for row in catalog.rows]
        kind = catalog.types.get(key, "str")
        if op in RANGES and kind == "str":
            raise Refused(text)  # a range on a text column
        if kind != "str" and not number:
            raise Refused(text)  # a number column and a value that is not one
    return np.array([_holds(cell, op, value, key, catalog) for cell in cells])


def _holds(cell: str, op: str, value: str, key: str, catalog: Catalog, numeric=False) -> bool:
    if not cell:
        return op == "!="  # an item without the value differs from every value
    if numeric or catalog.types.get(key) in ("int", "float"):
        left, right = float(cell), float(value)
    else:
        left, right = cell, value
    return {"=": left == right, "!=": left != right, ">=": left >= right, ">": left > right,
            "<=": left <= right, "<": left < right}[op]  # fmt: skip


def exact(vectors: np.ndarray, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return np.linalg.norm(vectors[ids].astype(np.float64) - query.astype(np.float64), axis=1)


# -- the routes ------------------------------------------------------------------------------


def _tags_listed(catalog: Catalog, hits) -> None:
    """Each hit's ``meta`` (``(id, meta)`` pairs) gives its tag column as the list of the tags
    its item holds, in their order (no tags: no entry)."""
    for item_id, meta in hits:
        held = [tag for tag in catalog.rows[item_id]["tags"].split("|") if tag]
        assert meta.get("tags", []) == held, (item_id, meta, held)


def python_route(folder: Path, query: dict, vector: np.ndarray, catalog: Catalog):
    rerank = RERANK if query["rerank"] else "none"
    asked = {"filters": query["filters"], "rerank": rerank, "offset": query["offset"]}
    with open_gallery(folder) as gallery:
        if query["id"] is not None:
            found = gallery.search_item(query["id"], query["k"], **asked)
        else:
            found = gallery.search_vector(vector, query["k"], **asked)
    _tags_listed(catalog, [(n.id, n.meta) for n in found])
    return [(n.id, n.distance) for n in found]


def cli_route(folder: Path, query: dict, vector_file: Path, catalog: Catalog, capsys):
    argv = ["search", "--gallery", str(folder), "--k", str(query["k"]), "--json",
            "--rerank", RERANK if query["rerank"] else "none", "--offset", str(query["offset"])]  # fmt: skip
    argv += (
        ["--id", str(query["id"])] if query["id"] is not None else ["--vector", str(vector_file)]
    )
    for condition in query["filters"]:
        argv += ["--filter", condition]
    code = main(argv)
    out, err = capsys.readouterr()
    if code != 0:
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
        raise NearsightError(err)
    _tags_listed(catalog, [(row["id"], row["meta"]) for row in json.loads(out)])
    return [(row["id"], row["distance"]) for row in json.loads(out)]


def rest_route(url: str, name: str, query: dict, vector: np.ndarray, catalog: Catalog):
    data = {"k": str(query["k"]), "gallery": name, "filter": ";".join(query["filters"]),
            "rerank": RERANK if query["rerank"] else "none", "offset": str(query["offset"])}  # fmt: skip
    if query["id"] is not None:
        data["id"] = str(query["id"])
    else:
        data["vector"] = json.dumps(vector.tolist())
    answer = httpx.post(f"{url.rstrip('/')}/api/search", data=data, timeout=60)
    if answer.status_code != 200:
        assert answer.status_code == 400 and set(answer.json()) == {"error"}, answer.text
        raise NearsightError(answer.json()["error"])
    neighbours = answer.json()["neighbours"]
    _tags_listed(catalog, [(row["id"], row["meta"]) for row in neighbours])
    return [(row["id"], row["distance"]) for row in neighbours]


def page_route(page, name: str, query: dict) -> list[int]:
    """The page's item query: leave-one-out, its grid's ids in order."""
    import gradio as gr

    try:
        grid, status, _ = page.item_grid(name, query["id"], query["k"],
                                         ";".join(query["filters"]), query["rerank"])  # fmt: skip
    except gr.Error as error:
        raise NearsightError(str(error)) from None
    if status.startswith("**Filter not applied**"):  # the message in place of the grid
        raise NearsightError(status)
    return [
        int(i) for i in re.findall(r'<figure class="ns-cell" data-rank="\d+" data-id="(\d+)"', grid)
    ]


# -- the test --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(onnx_gallery):
    """The 8-d test model: galleries record it, so the server can open them."""
    return onnx_gallery.model


_WRITTEN = itertools.count()


def _write(catalog: Catalog, folder: Path, model: Path, capsys) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "vectors.npy", catalog.vectors)
    with open(folder / "meta.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["path", "label", "sku", "price", "shop", "tags"])
        writer.writeheader()
        writer.writerows(
            {"path": f"/shop/img/{i}.jpg", **row} for i, row in enumerate(catalog.rows)
        )
    galleries = {}
    for index_type in INDEX_TYPES:
        out = folder / index_type
        code = main(["index", "import", "--vectors", str(folder / "vectors.npy"), "--meta",
                     str(folder / "meta.csv"), "--out", str(out), "--model", str(model),
                     "--index-type", index_type, "--list-column", "tags"])  # fmt: skip
        _, err = capsys.readouterr()
        assert code == 0, err
        if next(_WRITTEN) % 2 == 0:  # as built before the payload index: built on first open
            (out / PAYLOAD_FILE).unlink()
        galleries[index_type] = out
    return galleries


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],  # a failure prints its catalog and queries
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])  # fmt: skip
@given(catalog=catalogs(), data=st.data())
def test_every_route_answers_the_brute_force(catalog, data, model, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("oracle")
    galleries = _write(catalog, folder, model, capsys)
    drawn = [data.draw(queries(catalog)) for _ in range(8)]
    recalls: dict[str, list[float]] = {t: [] for t in INDEX_TYPES}
    with running_page(list(galleries.values()), analyse=False) as (url, demo):
        page = demo.nearsight
        for number, query in enumerate(drawn):
            vector = _query_vector(catalog, query)
            vector_file = folder / f"q{number}.npy"
            np.save(vector_file, vector[None, :])
            try:
                allowed = matches(catalog, query["filters"])
            except Refused:
                allowed = None
            for index_type, gallery in galleries.items():
                name = _name(page, gallery)
                routes = {
                    "python": partial(python_route, gallery, query, vector, catalog),
                    "cli": partial(cli_route, gallery, query, vector_file, catalog, capsys),
                    "rest": partial(rest_route, url, name, query, vector, catalog),
                }
                if allowed is None:  # every route refuses, in one line
                    for call in routes.values():
                        with pytest.raises(NearsightError):
                            call()
                    if query["id"] is not None:
                        with pytest.raises(NearsightError):
                            page_route(page, name, query)
                    continue
                answers = {route: call() for route, call in routes.items()}
                first = answers["python"]
                for route, answer in answers.items():  # one answer, whichever way it was asked
                    assert [i for i, _ in answer] == [i for i, _ in first], (route, query)
                    assert [d for _, d in answer] == pytest.approx([d for _, d in first], abs=1e-9)
                whole, longer = query, first
                if query["offset"]:  # a page: the long search's ranks after the offset
                    whole = {**query, "k": query["offset"] + query["k"], "offset": 0}
                    longer = python_route(gallery, whole, vector, catalog)
                    assert first == longer[query["offset"] :], query
                recall = _check(catalog, whole, vector, allowed, longer, index_type)
                if recall is not None:
                    recalls[index_type].append(recall)
                if query["id"] is not None:
                    _check_page(page, name, query, gallery, allowed)
    for index_type in INDEX_TYPES[1:]:  # the approximate types, on more plain queries too
        recalls[index_type] += _probe_recalls(catalog, galleries[index_type])
        assert np.mean(recalls[index_type]) >= 0.9, (index_type, recalls[index_type])


def _probe_recalls(catalog: Catalog, gallery: Path, count: int = 40, k: int = 10) -> list[float]:
    """recall@k of ``count`` queries near gallery items, unfiltered and filtered by the most
    common shop (searched by the Python API; the routes agree, as checked above)."""
    rng = np.random.default_rng(len(catalog.rows))
    shops = [row["shop"] for row in catalog.rows if row["shop"]]
    common = max(set(shops), key=shops.count)
    found = []
    with open_gallery(gallery) as opened:
        for n in range(count):
            vector = _query_vector(catalog, {"id": None, "vector_seed": int(rng.integers(1 << 30))})
            filters = [f"shop={common}"] if n % 2 else []
            allowed = matches(catalog, filters)
            ids = np.array([hit.id for hit in opened.search_vector(vector, k, filters=filters,
                                                                   rerank="none")])  # fmt: skip
            truth = np.sort(exact(catalog.vectors, vector, allowed))[: len(ids)]
            found.append(float((exact(catalog.vectors, vector, ids) <= truth[-1] + 1e-6).mean()))
    return found


def _name(page, gallery: Path) -> str:
    return next(name for name, view in page.views.items() if view.path == gallery)


def _query_vector(catalog: Catalog, query: dict) -> np.ndarray:
    if query["id"] is not None:
        return catalog.vectors[query["id"]]
    rng = np.random.default_rng(query["vector_seed"])
    vector = catalog.vectors[rng.integers(ITEMS)] + 0.3 * rng.normal(size=DIM)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def _check(catalog, query, vector, allowed, answer, index_type) -> float | None:
    """The answer against the brute force; the recall@k of an approximate, plain search."""
    ids = np.array([i for i, _ in answer], dtype=np.int64)
    distances = np.array([d for _, d in answer], dtype=np.float64)
    k = query["k"]
    assert len(ids) == min(k, len(allowed)), (index_type, query)
    assert np.isin(ids, allowed).all() and len(set(ids.tolist())) == len(ids)
    np.testing.assert_allclose(distances, exact(catalog.vectors, vector, ids), atol=1e-6)
    own = query["id"]
    if own is not None and own in allowed:
        assert ids[0] == own and distances[0] == 0.0  # itself first, before its duplicates
    if query["rerank"] or not len(ids):
        return None
    truth = exact(catalog.vectors, vector, allowed)
    best = np.sort(truth)[: len(ids)]
    if index_type == "flat":  # the exact top-k (ties between duplicates in any order)
        np.testing.assert_allclose(np.sort(distances), best, atol=1e-6)
        assert (np.diff(distances) >= -1e-12).all()
        return None
    threshold = best[-1] + 1e-6
    return float((exact(catalog.vectors, vector, ids) <= threshold).mean())


def _check_page(page, name, query, gallery, allowed) -> None:
    """The page's leave-one-out grid: the Python API's answer without the item itself."""
    shown = page_route(page, name, query)
    spec = page.rerank_spec(page.views[name], query["rerank"])
    with open_gallery(gallery) as opened:
        want = opened.search_item(query["id"], query["k"], filters=query["filters"],
                                  rerank=spec, leave_out=True)  # fmt: skip
    assert shown == [n.id for n in want], query
    assert query["id"] not in shown and np.isin(shown, allowed).all()
