"""``search --queries ... --out``: FILE.csv (one row per neighbour, the metadata as columns, an
unreadable query as a row with its error) says what FILE.jsonl says; grouped searches add a
``group`` column; another extension is refused in one line."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import FAST, assert_one_line_error, run


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


def test_out_csv_holds_what_jsonl_holds(capsys, shop, tmp_path):
    folder = tmp_path / "queries"
    folder.mkdir()
    for image in shop["images"][:4]:
        (folder / image.name).write_bytes(image.read_bytes())
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    base = ["search", "--gallery", shop["gallery"], "--queries", folder, "--k", 3, *FAST]
    for out in (tmp_path / "r.jsonl", tmp_path / "r.csv"):
        code, _, err = run(capsys, *base, "--out", out, "--offset", 1)
        assert code == 0, err
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    with open(tmp_path / "r.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    want = [
        (line["query"], str(hit["rank"]), str(hit["id"]), hit["key"], hit["meta"]["name"])
        for line in lines for hit in line.get("neighbours", [])
    ]  # fmt: skip
    assert [
        (r["query"], r["rank"], r["id"], r["key"], r["name"]) for r in rows if not r["error"]
    ] == want
    assert [r["query"] for r in rows if r["error"]] == [x["query"] for x in lines if "error" in x]
    assert {r["rank"] for r in rows if not r["error"]} == {"2", "3", "4"}  # the page after 1
    assert len(want) == 4 * 3
    code, _, err = run(capsys, *base, "--out", tmp_path / "g.csv", "--group-by", "shop",
                       "--group-size", 2)  # fmt: skip
    assert code == 0, err
    with open(tmp_path / "g.csv", newline="", encoding="utf-8") as handle:
        grouped = [row for row in csv.DictReader(handle) if not row["error"]]
    assert grouped and all(row["group"] == row["shop"] for row in grouped)
    for query in {row["query"] for row in grouped}:
        values = [row["group"] for row in grouped if row["query"] == query]
        assert len(set(values)) <= 3 and all(values.count(v) <= 2 for v in values)
    code, _, err = run(capsys, *base, "--out", tmp_path / "r.txt")
    assert_one_line_error(code, err, "write FILE.jsonl (JSON lines) or FILE.csv")
    assert not (tmp_path / "r.txt").exists()
