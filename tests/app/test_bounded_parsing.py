"""Parsing is bounded (issue 51, items 1 and 8): a JSON search body is at most 2 MB and is
parsed off the event loop, an event of the page holds a bounded number of values, and every
CSV reader checks its header's width (2,000 columns, SQLite's limit) before it reads a row and
never widens a short row."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from helpers import assert_one_line_error, running_page

from nearsight.core.errors import NearsightError
from nearsight.data.csv_table import MAX_COLUMNS, read_table

WIDE = 1_000_000


def test_index_import_refuses_a_million_column_header_in_one_line_and_little_memory(tmp_path):
    """Before: `index import` grew to 18 GB on this header and was killed by the kernel."""
    vectors = tmp_path / "v.npy"
    np.save(vectors, np.eye(4, 8, dtype=np.float32))
    meta = tmp_path / "meta.csv"
    header = ",".join(f"c{n}" for n in range(WIDE))
    meta.write_text(
        header + "\n" + "\n".join(",".join("1" * 1 for _ in range(3)) for _ in range(4))
    )
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's across the exec)
    script = (
        "import re, sys\nfrom nearsight.app.cli import main\ncode = main(sys.argv[1:])\n"
        "status = open('/proc/self/status').read()\n"
        "print('peak', re.search(r'VmHWM:\\s+(\\d+)', status).group(1))\nsys.exit(code)"
    )
    argv = ["index", "import", "--vectors", vectors, "--meta", meta, "--out", tmp_path / "g"]
    done = subprocess.run([sys.executable, "-c", script, *map(str, argv)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert_one_line_error(done.returncode, done.stderr, str(MAX_COLUMNS))
    peak_mb = int(done.stdout.split("peak")[-1]) / 1024
    assert peak_mb < 500, peak_mb


def test_the_csv_dataset_refuses_rows_wider_than_their_header(tmp_path):
    """Before: 60 rows of a million fields took the dataset reader 2.67 GB."""
    from nearsight.data.datasets.csv_manifest import load_csv

    (tmp_path / "a.png").write_bytes(b"")
    row = "a.png,cat," + ",".join("x" for _ in range(200_000))
    (tmp_path / "dataset.csv").write_text("path,label\n" + "\n".join([row] * 3) + "\n")
    with pytest.raises(NearsightError, match="line 2: 200002 fields, but the header names 2"):
        load_csv(tmp_path, "all")


def test_a_short_row_is_not_widened_and_a_wide_header_is_refused_before_any_row():
    table = read_table(io.StringIO("path,label,shop,price\na.png,cat\nb.png,dog,north,3\n"), "m")
    assert [row for _, row in table.rows()] == [
        {"path": "a.png", "label": "cat"},
        {"path": "b.png", "label": "dog", "shop": "north", "price": "3"},
    ]
    wide = ",".join(f"c{n}" for n in range(MAX_COLUMNS + 1))
    with pytest.raises(NearsightError, match=f"names {MAX_COLUMNS + 1} columns"):
        read_table(io.StringIO(wide + "\n" + "x\n"), "m")
    long_header = "c" * (MAX_COLUMNS * 256 + 10)
    with pytest.raises(NearsightError, match="the header is longer"):
        read_table(io.StringIO(long_header + "\n"), "m")


@pytest.fixture(scope="module")
def page_url(onnx_gallery):
    with running_page([onnx_gallery.gallery], analyse=False) as (url, _):
        yield url.rstrip("/")


def test_a_json_search_body_over_2_mb_is_refused_before_it_is_parsed(page_url):
    """Before: a 9.3 MB object of 500,000 extra keys was parsed and validated on the event
    loop (2.4 s each, every route waiting) and answered 422."""
    extra = {f"k{n}": n for n in range(500_000)}
    body = json.dumps({"id": 1, **extra}).encode()
    assert len(body) > 8_000_000
    answer = httpx.post(f"{page_url}/api/search", content=body, timeout=60,
                        headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 413 and "at most 2097152 bytes" in answer.json()["error"]

    def chunks():
        yield b'{"id": 1, "pad": "'
        for _ in range(30):
            yield b"x" * 100_000
        yield b'"}'

    streamed = httpx.post(f"{page_url}/api/search", content=chunks(), timeout=60,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert streamed.status_code == 413
    small = httpx.post(f"{page_url}/api/search", json={"id": 1, "k": 2}, timeout=60)
    assert small.status_code == 200 and len(small.json()["neighbours"]) == 2


def test_an_event_of_the_page_with_too_many_values_is_refused(page_url):
    data = {"data": [{f"k{n}": n for n in range(20_000)}], "fn_index": 0, "session_hash": "s"}
    answer = httpx.post(f"{page_url}/gradio_api/queue/join", json=data, timeout=60)
    assert answer.status_code == 413 and "too many values" in answer.text
