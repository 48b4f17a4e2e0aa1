"""The one gallery builder, called directly: ``nearsight.index.gallery.build.build_gallery``
builds, resumes after a real SIGKILL from its finished chunks, and shards over 2 processes
(RANK/WORLD_SIZE, as torchrun sets them) into the same gallery as 1 process; and
``import_gallery`` writes vectors embedded elsewhere with the same model meta."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port, tiny_model

from nearsight.core.errors import NearsightError
from nearsight.index.datasets.synthetic import write_synthetic
from nearsight.index.gallery.build import BuildReport, build_gallery, import_gallery
from nearsight.index.gallery.core import Gallery
from nearsight.models.embedder import load_embedder

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}

# A child build: chunks of 2 images. With HANG_AFTER_FIRST_CHUNK set, it blocks for ever once
# its first chunk is written, so the parent kills it at a known point (not a timed race).
CHILD = """
import sys, time
from pathlib import Path
import nearsight.index.chunks as chunks
from nearsight.index.gallery.build import build_gallery
from nearsight.models.embedder import load_embedder

model, out, hang = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
paths = [Path(line) for line in Path(sys.argv[4]).read_text().splitlines()]
real = chunks.write_chunk

def write_then_hang(*args, **kwargs):
    real(*args, **kwargs)
    while hang:
        time.sleep(1)

chunks.write_chunk = write_then_hang
report = build_gallery(load_embedder(model, device="cpu"), paths, out, chunk_size=2,
                       batch_size=1)
print(report.summary())
"""


def child(setup: dict, out: Path, *, hang: bool, env: dict | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-c", CHILD, setup["model"], out, "1" if hang else "0", setup["list"]]
    return subprocess.Popen(
        [str(arg) for arg in argv], env=env or ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def contents(folder: Path) -> tuple[list[dict], np.ndarray]:
    with Gallery.open(folder) as gallery:
        return gallery.all_items(), np.array(gallery.embeddings)


def assert_same_gallery(a: Path, b: Path) -> None:
    items_a, vectors_a = contents(a)
    items_b, vectors_b = contents(b)
    assert items_a == items_b
    np.testing.assert_allclose(vectors_a, vectors_b, atol=1e-6)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("builder")
    write_synthetic(root / "data", classes=3, per_class=3, size=32)
    paths = sorted((root / "data").rglob("*.png")) or sorted((root / "data").rglob("*.jpg"))
    assert len(paths) == 9
    (root / "list.txt").write_text("\n".join(map(str, paths)))
    model = tiny_model(root / "model.pt", seed=0)
    clean = root / "clean"
    report = build_gallery(load_embedder(model, device="cpu"), paths, clean, chunk_size=2)
    return {"paths": paths, "model": model, "clean": clean, "report": report,
            "list": root / "list.txt"}  # fmt: skip


def test_build_gallery_writes_the_gallery_and_reports_it(setup):
    report: BuildReport = setup["report"]
    assert (report.items, report.skipped, report.chunks, report.embedded) == (9, 0, 5, 5)
    assert report.reused == 0 and report.dim == 16 and report.world == 1
    items, vectors = contents(setup["clean"])
    assert [item["path"] for item in items] == [str(path) for path in setup["paths"]]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    with Gallery.open(setup["clean"]) as gallery:  # the one writer of the model meta
        assert gallery.meta["model"] == str(setup["model"])
        assert gallery.meta["model_spec"]["dim"] == 16
        assert gallery.index_type == report.index_type
    assert not setup["clean"].with_name(".clean.chunks").exists()


def test_an_unreadable_image_is_skipped_and_reported(setup, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    paths = [*setup["paths"][:3], bad]
    report = build_gallery(load_embedder(setup["model"], device="cpu"), paths, tmp_path / "g")
    assert (report.items, report.skipped, len(report.unreadable)) == (3, 1, 1)


def test_import_gallery_writes_the_same_model_meta_and_checks_the_dim(setup, tmp_path):
    """Vectors embedded elsewhere: the one model-meta writer, and a model of another dim is
    refused before anything is written."""
    items, vectors = contents(setup["clean"])
    rows = [{key: item[key] for key in ("path", "label")} for item in items]
    embedder = load_embedder(setup["model"], device="cpu")
    report = import_gallery(vectors, rows, tmp_path / "g", embedder=embedder,
                            model_path=setup["model"])  # fmt: skip
    assert (report.items, report.dim, report.index_type) == (9, 16, "flat")
    with Gallery.open(tmp_path / "g") as imported, Gallery.open(setup["clean"]) as built:
        for key in ("model", "model_spec"):
            assert imported.meta[key] == built.meta[key]
        assert imported.model_sha256 == built.model_sha256
    with pytest.raises(NearsightError, match="embeds in dim 16 but the vectors have dim 8"):
        import_gallery(vectors[:, :8], rows, tmp_path / "h", embedder=embedder)
    assert not (tmp_path / "h").exists()


@pytest.mark.slow  # a child process (torch import)
def test_a_build_killed_after_its_first_chunk_resumes_and_equals_a_clean_build(setup, tmp_path):
    out = tmp_path / "g"
    chunks = tmp_path / ".g.chunks"
    process = child(setup, out, hang=True)
    try:
        deadline = time.monotonic() + 240
        while not list(chunks.glob("*.csv")) and process.poll() is None:
            assert time.monotonic() < deadline, "the child wrote no chunk"
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()[1][-3000:]
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    assert sorted(p.name for p in chunks.glob("*.csv")) == ["part-000000.csv"]
    assert not out.exists()
    report = build_gallery(
        load_embedder(setup["model"], device="cpu"), setup["paths"], out, chunk_size=2
    )
    assert (report.chunks, report.reused, report.embedded, report.items) == (5, 1, 4, 9)
    assert_same_gallery(out, setup["clean"])


@pytest.mark.slow  # two child processes (torch imports)
def test_two_process_build_equals_the_one_process_build(setup, tmp_path):
    out = tmp_path / "two"
    port = str(free_port())
    processes = [
        child(setup, out, hang=False, env={
            **ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        })  # fmt: skip
        for rank in range(2)
    ]
    results = [process.communicate(timeout=300) for process in processes]
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-3000:]
    assert "9 items" in results[0][0] and "2 processes" in results[0][0]
    assert "rank 1: embedded 2 chunks, reused 0" in results[1][0]  # chunks 1 and 3 of 0..4
    assert_same_gallery(out, setup["clean"])
