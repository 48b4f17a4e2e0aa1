"""`nearsight index build|add|remove`, `nearsight search`, `nearsight eval` end to end, on a
small synthetic dataset and a random tiny embedding network (a checkpoint, and once ONNX)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAST, assert_one_line_error, run, started, tiny_model

from nearsight.app.cli import main
from nearsight.data.datasets import load_dataset
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.data.images import load_image
from nearsight.data.metrics.retrieval import evaluate, recall_at_k
from nearsight.index.gallery.core import Gallery
from nearsight.models.checkpoint import load_embedding_net
from nearsight.models.preprocess import test_transform as make_test_transform


def search_json(capsys, gallery: Path, image: Path, k: int = 5) -> list[dict]:
    code, out, err = run(capsys, "search", "--gallery", gallery, image, "--k", k, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("cli")
    write_synthetic(root / "data", classes=6, per_class=4, size=32)
    model = tiny_model(root / "model.pt", seed=0)
    gallery = root / "gallery"
    assert main(["index", "build", "--model", str(model), "--dataset", "folder", "--root",
                 str(root / "data"), "--out", str(gallery), *FAST]) == 0  # fmt: skip
    yield {"root": root, "data": root / "data", "model": model, "gallery": gallery}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def onnx_built(setup) -> dict:
    """The module's model exported to ONNX and its gallery built again with it (a process
    that searches or adds with it imports no torch)."""
    from nearsight.models.export import export_onnx

    model = setup["root"] / "model.onnx"
    export_onnx(setup["model"], model)
    gallery = setup["root"] / "gallery-onnx"
    assert main(["index", "build", "--model", str(model), "--dataset", "folder", "--root",
                 str(setup["data"]), "--out", str(gallery), *FAST]) == 0  # fmt: skip
    return {"model": model, "gallery": gallery}


@pytest.fixture
def gallery_copy(setup, tmp_path) -> Path:
    """A private copy of the module's gallery, for tests that change it."""
    copy = tmp_path / "gallery"
    shutil.copytree(setup["gallery"], copy)
    return copy


def test_eval_equals_recall_computed_from_the_checkpoint(setup, capsys):
    split = load_dataset("folder", setup["data"], "test")
    net = load_embedding_net(setup["model"])
    transform = make_test_transform(32)
    with torch.no_grad():
        batch = torch.from_numpy(np.stack([transform(load_image(path)) for path in split.paths]))
        embeddings = net(batch).numpy()
    expected = recall_at_k(embeddings, split.labels, (1, 2, 4, 8))

    code, out, err = run(capsys, "eval", "--gallery", setup["gallery"], "--json")
    assert code == 0, err
    result = json.loads(out)
    assert list(result) == ["recall@1", "recall@2", "recall@4", "recall@8", "nmi", "map@r",
                            "queries", "rerank", "unlabelled"]  # fmt: skip
    assert result["rerank"] == "none" and result["unlabelled"] == 0
    assert result["queries"] == 12
    for k, value in expected.items():
        assert result[f"recall@{k}"] == pytest.approx(value, abs=1e-6)
    reference = evaluate(embeddings, split.labels, (1, 2, 4, 8))
    assert result["map@r"] == pytest.approx(reference["map@r"], abs=1e-6)
    assert result["nmi"] == pytest.approx(reference["nmi"], abs=1e-6)

    code, out, _ = run(capsys, "eval", "--gallery", setup["gallery"], "--k", "1", "3", "--json")
    assert code == 0 and list(json.loads(out))[:2] == ["recall@1", "recall@3"]
    code, out, _ = run(capsys, "eval", "--gallery", setup["gallery"])
    assert code == 0 and out.startswith("recall@1 ") and "(12 labelled items queried)" in out


def test_build_records_the_catalog_and_meta(setup):
    with Gallery.open(setup["gallery"]) as gallery:
        meta = gallery.meta
        assert meta["dataset"] == "folder" and meta["split"] == "test" and meta["count"] == 12
        assert meta["model"] == str(setup["model"]) and meta["model_spec"]["image_size"] == 32
        assert meta["index_type"] == "flat" and meta["dim"] == 16 and meta["skipped"] == 0
        items = gallery.all_items()
    split = load_dataset("folder", setup["data"], "test")
    assert [item["path"] for item in items] == [str(path) for path in split.paths]
    assert [item["label"] for item in items] == split.labels
    first = items[0]
    assert first["split"] == "test" and first["class_name"] == split.samples[0].class_name
    assert (first["width"], first["height"]) == (32, 32) and len(first["sha256"]) == 64


def test_search_json_and_table(setup, capsys):
    query = load_dataset("folder", setup["data"], "test").paths[5]
    results = search_json(capsys, setup["gallery"], query, k=4)
    assert len(results) == 4
    for row in results:
        assert {"id", "path", "label", "distance"} <= set(row)
        assert isinstance(row["id"], int) and isinstance(row["distance"], float)
    assert results[0]["id"] == 5 and results[0]["path"] == str(query)  # itself, first
    assert results[0]["distance"] < 1e-3
    distances = [row["distance"] for row in results]
    assert distances == sorted(distances) and all(0 <= d <= 2 for d in distances)

    code, out, _ = run(capsys, "search", "--gallery", setup["gallery"], query, "--k", "2")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and lines[0].split()[:3] == ["rank", "id", "distance"]
    assert lines[1].split()[:2] == ["1", "5"] and lines[1].endswith(str(query))


def test_add_then_remove_returns_to_the_same_search_results(setup, gallery_copy, capsys):
    queries = load_dataset("folder", setup["data"], "test").paths[:2]
    extra = load_dataset("folder", setup["data"], "train").paths[:2]
    before = [search_json(capsys, gallery_copy, query, k=12) for query in queries]

    code, out, err = run(capsys, "index", "add", "--gallery", gallery_copy, *extra,
                         "--label", "7", "--class-name", "added", *FAST)  # fmt: skip
    assert code == 0, err
    assert "added 2 items (ids 12, 13)" in out and "14 items" in out
    found = search_json(capsys, gallery_copy, extra[1], k=1)[0]
    assert found["id"] == 13 and found["label"] == 7 and found["class_name"] == "added"

    code, out, err = run(capsys, "index", "remove", "--gallery", gallery_copy, "--ids", "12", "13")
    assert code == 0 and "removed 2 items" in out and "12 items" in out, err
    assert [search_json(capsys, gallery_copy, query, k=12) for query in queries] == before


def test_remove_of_an_unknown_id_changes_nothing(gallery_copy, capsys):
    code, _, err = run(capsys, "index", "remove", "--gallery", gallery_copy, "--ids", "3", "99")
    assert_one_line_error(code, err, "has no item with id 99")
    with Gallery.open(gallery_copy) as gallery:
        assert len(gallery) == 12


def test_a_different_model_is_refused(setup, capsys):
    other = tiny_model(setup["root"] / "other.pt", seed=1)
    narrow = tiny_model(setup["root"] / "narrow.pt", seed=0, dim=8)
    query = load_dataset("folder", setup["data"], "test").paths[0]
    for model, dim in ((other, 16), (narrow, 8)):
        code, _, err = run(capsys, "search", "--gallery", setup["gallery"], query,
                           "--model", model)  # fmt: skip
        assert_one_line_error(
            code, err, "was built with model sha256", f"but {model} is", f"(dim {dim})",
            "rebuild the gallery or pass the model it was built with",
        )  # fmt: skip
        code, _, err = run(capsys, "index", "add", "--gallery", setup["gallery"], query,
                           "--model", model, *FAST)  # fmt: skip
        assert_one_line_error(code, err, "was built with model sha256")
    with Gallery.open(setup["gallery"]) as gallery:
        assert len(gallery) == 12


def test_an_unreadable_image_is_skipped_and_counted(setup, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(setup["data"], data)
    broken = sorted((data / "test").rglob("*.png"))[2]
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    code, out, err = run(capsys, "index", "build", "--model", setup["model"], "--dataset",
                         "folder", "--root", data, "--out", tmp_path / "g", *FAST)  # fmt: skip
    assert code == 0, err
    assert "11 items, 1 unreadable skipped" in out
    skipped = [line for line in err.splitlines() if line.startswith("nearsight: skipped:")]
    assert len(skipped) == 1 and str(broken) in skipped[0]
    with Gallery.open(tmp_path / "g") as gallery:
        assert len(gallery) == 11 and gallery.meta["skipped"] == 1
        assert str(broken) not in {item["path"] for item in gallery.all_items()}


def test_no_readable_image_is_an_error(setup, tmp_path, capsys):
    bad = [tmp_path / "a.png", tmp_path / "b.jpg"]
    bad[0].write_bytes(b"not a png")
    code, _, err = run(capsys, "index", "build", "--model", setup["model"], "--images", *bad,
                       "--out", tmp_path / "g", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "none of the 2 images could be read")
    assert not (tmp_path / "g").exists()


def test_build_from_a_list_file_and_from_images(setup, tmp_path, capsys):
    paths = load_dataset("folder", setup["data"], "test").paths[:5]
    listing = tmp_path / "images.txt"
    relative = [os.path.relpath(path, tmp_path) for path in paths]
    listing.write_text("# gallery\n" + "\n".join(relative) + "\n\n")
    code, out, err = run(capsys, "index", "build", "--model", setup["model"], "--list", listing,
                         "--out", tmp_path / "g1", *FAST)  # fmt: skip
    assert code == 0 and "5 items" in out, err
    code, out, err = run(capsys, "index", "build", "--model", setup["model"], "--images",
                         *paths[:3], "--out", tmp_path / "g2", *FAST)  # fmt: skip
    assert code == 0 and "3 items" in out, err
    with Gallery.open(tmp_path / "g1") as gallery:
        assert [item["path"] for item in gallery.all_items()] == [str(p) for p in paths]
        assert all(item["label"] is None for item in gallery.all_items())
        assert gallery.meta["source"] == str(listing)


@pytest.mark.parametrize("index_type", ["ivf", "hnsw"])
def test_approximate_index_types_find_each_item_first(setup, tmp_path, capsys, index_type):
    out_dir = tmp_path / index_type
    code, _, err = run(capsys, "index", "build", "--model", setup["model"], "--dataset", "folder",
                       "--root", setup["data"], "--out", out_dir, "--index-type", index_type,
                       *FAST)  # fmt: skip
    assert code == 0, err
    with Gallery.open(out_dir) as gallery:
        assert gallery.index_type == index_type
        _, ids = gallery.search(np.asarray(gallery.embeddings), 1)
        np.testing.assert_array_equal(ids[:, 0], gallery.ids)
    query = load_dataset("folder", setup["data"], "test").paths[7]
    assert search_json(capsys, out_dir, query, k=3)[0]["id"] == 7


def test_bad_input_is_one_line_and_exit_2(setup, tmp_path, capsys):
    query = load_dataset("folder", setup["data"], "test").paths[0]
    gallery = setup["gallery"]
    unreadable = tmp_path / "broken.jpg"
    unreadable.write_bytes(b"\xff\xd8 not really a jpeg")
    (tmp_path / "plain").mkdir()
    cases = [
        (["search", "--gallery", tmp_path / "missing", query], "no gallery at"),
        (["search", "--gallery", tmp_path / "plain", query], "not a nearsight gallery"),
        (["eval", "--gallery", tmp_path / "missing"], "no gallery at"),
        (["search", "--gallery", gallery, tmp_path / "nope.png"], "no such file"),
        (["search", "--gallery", gallery, unreadable], f"cannot read image {unreadable}"),
        (["search", "--gallery", gallery, query, "--k", "0"], "k must be a whole number of at least 1"),
        (["index", "remove", "--gallery", tmp_path / "missing", "--ids", "1"], "no gallery at"),
        (["index", "build", "--model", tmp_path / "none.onnx", "--dataset", "folder", "--root",
          setup["data"], "--out", tmp_path / "g"], "model not found"),
        (["index", "build", "--model", setup["model"], "--dataset", "folder", "--root",
          setup["data"], "--out", tmp_path / "plain2"], "not a nearsight gallery"),
        (["index", "build", "--model", setup["model"], "--dataset", "folder",
          "--out", tmp_path / "g"], "--root is required"),
    ]  # fmt: skip
    (tmp_path / "plain2").mkdir()
    (tmp_path / "plain2" / "keep.txt").write_text("mine")
    for argv, fragment in cases:
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, fragment)
    assert (tmp_path / "plain2" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "g").exists()


def test_search_through_the_exported_onnx_model(setup, onnx_built, capsys):
    gallery = onnx_built["gallery"]  # built by the CLI from the exported model
    query = load_dataset("folder", setup["data"], "test").paths[4]
    results = search_json(capsys, gallery, query, k=3)
    assert results[0]["id"] == 4 and results[0]["distance"] < 1e-3
    code, out, _ = run(capsys, "eval", "--gallery", gallery, "--json")
    assert code == 0 and json.loads(out)["queries"] == 12
    # the checkpoint it came from is another model file: searching with it is refused
    code, _, err = run(capsys, "search", "--gallery", gallery, query, "--model", setup["model"])
    assert_one_line_error(code, err, "rebuild the gallery")


# -- processes: SIGKILL part-way, concurrent adds ---------------------------------------------


def _cli(*argv) -> list[str]:
    return [sys.executable, "-m", "nearsight.app.cli", *[str(arg) for arg in argv]]


@pytest.mark.slow  # a CLI process (imports torch)
def test_killing_a_build_part_way_leaves_the_previous_gallery(setup, tmp_path, capsys):
    gallery = tmp_path / "g"
    shutil.copytree(setup["gallery"], gallery)
    before = search_json(capsys, gallery, load_dataset("folder", setup["data"], "test").paths[0])
    many = load_dataset("folder", setup["data"], "all").paths * 10  # 240 images, 60 batches
    # stderr on a terminal: the progress bar shows as soon as embedding starts
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # tqdm needs columns
    # (the file opened on master closes it when the block ends)
    with started(
        _cli("index", "build", "--model", setup["model"], "--images", *many, "--out", gallery,
             "--batch-size", "4", *FAST),
        stdout=subprocess.DEVNULL, stderr=slave,
    ) as process, open(master, "rb", buffering=0):  # fmt: skip
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 120
        while b"embedding" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break  # the process ended
        assert b"embedding" in seen, seen.decode(errors="replace")
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    with Gallery.open(gallery) as opened:
        assert len(opened) == 12
    assert search_json(capsys, gallery, load_dataset("folder", setup["data"], "test").paths[0]) == (
        before
    )
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert visible == ["g"]


@pytest.mark.slow  # two CLI processes
def test_two_concurrent_adds_both_land(setup, onnx_built, tmp_path):
    gallery_copy = tmp_path / "gallery"  # the ONNX model's: the processes need no torch
    shutil.copytree(onnx_built["gallery"], gallery_copy)
    extra = load_dataset("folder", setup["data"], "train").paths
    add = ("index", "add", "--gallery", gallery_copy)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with (
        started(_cli(*add, *extra[:3], *FAST), **pipes) as first,
        started(_cli(*add, *extra[3:5], *FAST), **pipes) as second,
    ):
        for process in (first, second):
            _, err = process.communicate(timeout=300)
            assert process.returncode == 0, err.decode()
    with Gallery.open(gallery_copy) as gallery:
        assert len(gallery) == 17
        np.testing.assert_array_equal(gallery.ids, np.arange(17))
        added = {item["path"] for item in gallery.items(range(12, 17))}
        assert added == {str(path) for path in extra[:5]}


def test_eval_json_stays_valid_when_map_at_r_is_undefined(tmp_path, capsys):
    from nearsight.index.gallery.write import write_gallery

    vectors = np.eye(4, dtype=np.float32)
    items = [{"path": f"/x/{i}.png", "label": i} for i in range(4)]  # no class has two items
    write_gallery(tmp_path / "g", vectors, items, model_sha256="0" * 64)
    code, out, err = run(capsys, "eval", "--gallery", tmp_path / "g", "--json")
    assert code == 0, err
    result = json.loads(out)  # strict JSON: no NaN
    assert result["map@r"] is None and result["recall@1"] == 0.0 and result["queries"] == 4
