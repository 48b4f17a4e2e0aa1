"""Item keys of any text (issue 32, item 6): a key holding '/', '%', spaces, unicode, '?' or
'#' is read, replaced and removed through the CLI and Python, and read over REST by a query
parameter or a percent-encoded path; unknown keys are 404s that name no server path."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from helpers import FAST, assert_one_line_error, run, running_page

import nearsight
from nearsight.core.errors import NearsightError

KEYS = [
    "a/b",
    "50% off",
    "a%2Fb",  # a literal percent sign and "2F": not a slash
    "two words",
    "ünï/鍵",
    "what?",
    "#1",
    "../up",
    "-neg",  # the CLI takes it as --key=-neg
    "a//b/",
]


@pytest.fixture(scope="module")
def keyed(onnx_gallery, tmp_path_factory) -> Iterator[dict]:
    """A gallery of the ONNX fixture's first images, keyed by KEYS (built from a CSV)."""
    root = tmp_path_factory.mktemp("keyed")
    images = sorted(onnx_gallery.data.rglob("*.png"))
    manifest = root / "catalog.csv"
    with open(manifest, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "key"])
        for n, key in enumerate(KEYS):
            writer.writerow([images[n], n % 3, key])
    gallery = root / "gallery"
    nearsight.build_gallery(onnx_gallery.model, gallery, dataset="csv", root=manifest,
                            workers=0).close()  # fmt: skip
    with nearsight.open_gallery(gallery) as opened:
        ids = {row["meta"]["key"]: row["id"] for row in opened.gallery.all_items()}
    assert sorted(ids) == sorted(KEYS)
    yield {"gallery": gallery, "ids": ids, "spare": images[len(KEYS)]}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def copy(keyed, tmp_path) -> Path:
    shutil.copytree(keyed["gallery"], tmp_path / "g")
    return tmp_path / "g"


def show(capsys, gallery: Path, key: str) -> tuple[int, dict | None, str]:
    code, out, err = run(capsys, "index", "show", "--gallery", gallery, f"--key={key}")
    return code, json.loads(out) if code == 0 else None, err


def test_the_cli_reads_replaces_and_removes_keys_of_any_text(keyed, copy, capsys):
    for key in KEYS:
        code, row, err = show(capsys, copy, key)
        assert code == 0, (key, err)
        assert row["id"] == keyed["ids"][key] and row["meta"]["key"] == key
    code, out, err = run(capsys, "index", "add", "--gallery", copy, keyed["spare"], "--key=a/b",
                         "--label", "1", *FAST)  # fmt: skip
    assert code == 0, err
    assert f"replacing item {keyed['ids']['a/b']} (key 'a/b')" in out
    code, row, _ = show(capsys, copy, "a/b")
    assert (
        code == 0 and row["id"] not in keyed["ids"].values() and row["path"] == str(keyed["spare"])
    )
    code, out, err = run(capsys, "index", "remove", "--gallery", copy, "--keys", "50% off",
                         "ünï/鍵", "#1", "what?")  # fmt: skip
    assert code == 0 and out.startswith("removed 4 items"), err
    code, out, err = run(capsys, "index", "remove", "--gallery", copy, "--keys=-neg")
    assert code == 0 and out.startswith("removed 1 items"), err
    for gone in ("50% off", "ünï/鍵", "-neg"):
        code, _, err = show(capsys, copy, gone)
        assert_one_line_error(code, err, f"no item with key {gone!r}")
    assert show(capsys, copy, "a%2Fb")[1]["id"] == keyed["ids"]["a%2Fb"]  # not "a/b"
    code, _, err = run(capsys, "index", "show", "--gallery", copy, "--id", keyed["ids"]["#1"])
    assert_one_line_error(code, err, "no item with id")


def test_python_reads_replaces_and_removes_keys_of_any_text(keyed, copy):
    for key in KEYS:
        assert nearsight.get_item(copy, key=key)["id"] == keyed["ids"][key]
    assert nearsight.get_item(copy, key="  two words ")["meta"]["key"] == "two words"  # stripped
    with nearsight.open_gallery(copy) as gallery:
        (new,) = nearsight.add_images(gallery, [keyed["spare"]], key="ünï/鍵", workers=0)
        assert len(gallery) == len(KEYS)  # replaced, seen by the open gallery
        assert nearsight.get_item(gallery, key="ünï/鍵")["id"] == new
        assert nearsight.get_item(gallery, new)["meta"] == {"key": "ünï/鍵"}
        nearsight.remove_items(gallery, keys=["../up", "a//b/"])
        assert len(gallery) == len(KEYS) - 2
        with pytest.raises(NearsightError, match="no item with key '../up'"):
            nearsight.get_item(gallery, key="../up")
        with pytest.raises(NearsightError, match="no item with key 'nope'"):
            nearsight.remove_items(gallery, keys=["a/b", "nope"])  # one unknown: none removed
        assert len(gallery) == len(KEYS) - 2
        with pytest.raises(NearsightError, match="a key may not be empty"):
            nearsight.add_images(gallery, [keyed["spare"]], key="  ", workers=0)
        with pytest.raises(NearsightError, match="an id or a key"):
            nearsight.get_item(gallery, 1, key="a/b")


def test_rest_reads_keys_of_any_text_by_query_and_by_encoded_path(keyed, onnx_gallery):
    with running_page([keyed["gallery"], onnx_gallery.gallery], analyse=False) as (url, _):
        api = f"{url.rstrip('/')}/api/items/by-key"
        health = httpx.get(f"{url.rstrip('/')}/api/health", timeout=30).json()
        unkeyed = health["galleries"][1]["name"]
        for key in KEYS:
            by_query = httpx.get(api, params={"key": key}, timeout=30)
            by_path = httpx.get(f"{api}/{quote(key, safe='')}", timeout=30)
            for answer in (by_query, by_path):
                assert answer.status_code == 200, (key, answer.text)
                assert answer.json()["id"] == keyed["ids"][key]
                assert answer.json()["meta"] == {"key": key}
        unknown = [
            httpx.get(api, params={"key": "no/such key"}, timeout=30),
            httpx.get(f"{api}/{quote('no/such key', safe='')}", timeout=30),
            httpx.get(api, params={"key": "a/b", "gallery": unkeyed}, timeout=30),
        ]
        for answer in unknown:
            assert answer.status_code == 404, answer.text
            assert str(keyed["gallery"].parent) not in answer.text  # no server path
            assert str(onnx_gallery.gallery.parent) not in answer.text
        assert "no item with that key" in unknown[0].json()["error"]
        assert "has no key column" in unknown[2].json()["error"]
        too_long = httpx.get(api, params={"key": "k" * 201}, timeout=30)
        assert too_long.status_code == 422 and "key" in too_long.json()["error"]
        assert httpx.get(api, timeout=30).status_code == 422  # no key at all


def test_one_key_rule_on_every_route(keyed, copy, capsys):
    """One rule (nearsight/index/gallery/keys.py normal_key) for the CLI, Python and REST:
    spaces around a key dropped, Unicode NFC (a decomposed "ü" is the same key), at most 200
    characters (before: the CLI stored keys REST refused, and NFC and NFD spellings were two
    keys)."""
    import unicodedata

    decomposed = unicodedata.normalize("NFD", "ünï/鍵")
    assert decomposed != "ünï/鍵"
    code, row, err = show(capsys, copy, f"  {decomposed} ")
    assert code == 0 and row["id"] == keyed["ids"]["ünï/鍵"], err
    code, out, err = run(capsys, "index", "add", "--gallery", copy, keyed["spare"],
                         f"--key={'k' * 201}", "--label", "1", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "at most 200 characters")
    with pytest.raises(NearsightError, match="at most 200 characters"):
        nearsight.add_images(copy, [keyed["spare"]], key="k" * 201, workers=0)
    code, out, err = run(capsys, "index", "add", "--gallery", copy, keyed["spare"],
                         f"--key={decomposed}", "--label", "1", *FAST)  # fmt: skip
    assert code == 0 and f"replacing item {keyed['ids']['ünï/鍵']}" in out, (out, err)
    with running_page([copy], analyse=False) as (url, _):
        api = f"{url.rstrip('/')}/api/items/by-key"
        for spelling in (decomposed, f" {decomposed}  "):
            by_query = httpx.get(api, params={"key": spelling}, timeout=30)
            by_path = httpx.get(f"{api}/{quote(spelling, safe='')}", timeout=30)
            for answer in (by_query, by_path):
                assert answer.status_code == 200, answer.text
                assert answer.json()["meta"] == {"key": "ünï/鍵"}
        spaced = httpx.get(api, params={"key": " " + "k" * 199 + " "}, timeout=30)
        assert spaced.status_code == 404  # 199 characters once trimmed: a key, not held
        too_long = httpx.get(api, params={"key": "k" * 201}, timeout=30)
        assert too_long.status_code == 422 and "at most 200 characters" in too_long.json()["error"]


def test_nfc_and_nfd_spellings_of_one_key_are_one_key(onnx_gallery, tmp_path):
    import unicodedata

    images = sorted(onnx_gallery.data.rglob("*.png"))
    manifest = tmp_path / "catalog.csv"
    with open(manifest, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "key"])
        writer.writerow([images[0], 0, "café"])
        writer.writerow([images[1], 1, unicodedata.normalize("NFD", "café")])
    with pytest.raises(NearsightError, match="repeats 1 keys"):
        nearsight.build_gallery(onnx_gallery.model, tmp_path / "g", dataset="csv",
                                root=manifest, workers=0)  # fmt: skip
