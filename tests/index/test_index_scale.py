"""Galleries past one process: sharded, resumable builds under torchrun (gloo, CPU), galleries
imported from vectors, and appends that write the added items, not the gallery."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAST, cli_argv, run, started

from nearsight.app.cli import main
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.write import write_gallery
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def contents(folder: Path) -> tuple[list[dict], np.ndarray, np.ndarray]:
    with Gallery.open(folder) as gallery:
        return gallery.all_items(), np.array(gallery.ids), np.array(gallery.embeddings)


def assert_same_gallery(a: Path, b: Path) -> None:
    items_a, ids_a, vectors_a = contents(a)
    items_b, ids_b, vectors_b = contents(b)
    assert items_a == items_b
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_allclose(vectors_a, vectors_b, atol=1e-6)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("scale")
    write_synthetic(root / "data", classes=6, per_class=4, size=32)
    torch.manual_seed(0)
    config = EmbeddingConfig(dim=16, image_size=32, arch="resnet18", pretrained="none")
    model = save_checkpoint(root / "model.pt", EmbeddingNet(config))
    build = ["index", "build", "--model", model, "--dataset", "folder", "--root", root / "data",
             "--split", "all", "--chunk-size", "5", *FAST]  # fmt: skip
    single = root / "single"
    assert main([str(arg) for arg in [*build, "--out", single]]) == 0
    yield {"root": root, "model": model, "build": build, "single": single}
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow  # two CLI processes (torch imports)
def test_two_process_build_equals_the_one_process_build(setup, tmp_path):
    """What torchrun does: two processes with RANK / WORLD_SIZE and a rendezvous address; each
    embeds every other chunk of 5 images, rank 0 merges. Same items, ids and vectors."""
    out = tmp_path / "two"
    port = str(29500 + os.getpid() % 1000)

    def rank(number: int) -> dict:
        return {"RANK": str(number), "LOCAL_RANK": str(number), "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip

    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    argv = cli_argv(*setup["build"], "--out", out)
    with (
        started(argv, env={**ENV, **rank(0)}, **pipes) as first,
        started(argv, env={**ENV, **rank(1)}, **pipes) as second,
    ):
        processes = [first, second]
        results = [process.communicate(timeout=300) for process in processes]
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-3000:]
    assert "2 processes" in results[0][0] and "rank 1: embedded 2 chunks" in results[1][0]
    assert_same_gallery(out, setup["single"])
    assert not out.with_name(".two.chunks").exists()  # chunks go once the gallery is written


@pytest.mark.slow  # a CLI process (torch import)
def test_a_build_killed_part_way_resumes_from_its_finished_chunks(setup, tmp_path, capsys):
    out = tmp_path / "g"
    chunks = tmp_path / ".g.chunks"
    with started(
        cli_argv(*setup["build"], "--out", out, "--chunk-size", "2", "--batch-size", "1"),
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    ) as process:  # fmt: skip
        deadline = time.monotonic() + 180
        while len(list(chunks.glob("*.csv"))) < 3 and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finished = sorted(p.name for p in chunks.glob("*.csv"))
    assert 3 <= len(finished) < 12 and not out.exists()
    stamps = {name: (chunks / name).stat().st_mtime_ns for name in finished}
    with pytest.MonkeyPatch.context() as patch:  # resumed chunks are not written again
        import nearsight.index.chunks as chunk_module

        written: list[str] = []
        real = chunk_module.write_chunk
        patch.setattr(
            chunk_module,
            "write_chunk",
            lambda f, name, *a: written.append(name) or real(f, name, *a),
        )
        code, stdout, err = run(capsys, *setup["build"], "--out", out, "--chunk-size", "2")
    assert code == 0, err
    assert f"{len(finished)} chunks reused" in stdout
    assert not {f"{name[:-4]}" for name in finished} & set(written)
    assert len(stamps) == len(finished)
    assert_same_gallery(out, setup["single"])


def test_a_changed_build_does_not_reuse_chunks(setup, tmp_path, capsys):
    """Chunks of another model, image list or chunk size are thrown away, not mixed in."""
    out = tmp_path / "g"
    chunks = tmp_path / ".g.chunks"
    chunks.mkdir()
    (chunks / "manifest.json").write_text(json.dumps({"model_sha256": "other"}))
    np.save(chunks / "part-000000.npy", np.ones((5, 16), np.float32) / 4)
    (chunks / "part-000000.csv").write_text("path,label\n" + "x,0\n" * 5)
    code, stdout, err = run(capsys, *setup["build"], "--out", out)
    assert code == 0, err
    assert "reused" not in stdout
    assert_same_gallery(out, setup["single"])


def test_a_pq_build_past_the_budget_keeps_its_chunks_instead_of_embeddings(setup, tmp_path, capsys):
    """--embeddings auto past --max-index-memory: a PQ index holds codes only, so the build
    keeps its chunk folder as the gallery's exact vectors and writes no embeddings.npy."""
    write_synthetic(tmp_path / "data", classes=8, per_class=32, size=32)  # 256: a PQ's floor
    out = tmp_path / "g"
    build = ["index", "build", "--model", setup["model"], "--dataset", "folder", "--root",
             tmp_path / "data", "--split", "all", "--chunk-size", "100", *FAST]  # fmt: skip
    options = ["--index-type", "ivfpq", "--max-index-memory", "1K"]
    code, stdout, err = run(capsys, *build, "--out", out, *options)
    assert code == 0, err
    assert "256 items" in stdout and "chunks kept in" in stdout
    chunks = tmp_path / ".g.chunks"
    assert not (out / "embeddings.npy").exists() and chunks.is_dir()
    expected = np.concatenate([np.load(part) for part in sorted(chunks.glob("part-*.npy"))])
    with Gallery.open(out) as gallery:
        assert gallery.meta["embeddings_kept"] is False and gallery.vectors_exact
        np.testing.assert_allclose(gallery.embeddings, expected, atol=1e-6)
    code, _, err = run(capsys, "eval", "--gallery", out)
    assert code == 0 and err == ""  # exact vectors: no note


# -- import ----------------------------------------------------------------------------------


def clustered(count: int, classes: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim)).astype(np.float32)
    labels = np.arange(count) % classes
    vectors = centres[labels] + 0.3 * rng.standard_normal((count, dim)).astype(np.float32)
    return vectors, labels


def write_meta(path: Path, labels: np.ndarray) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", "path", "colour"])  # an extra column: ignored
        writer.writerows([int(label), f"/items/{i}.jpg", "red"] for i, label in enumerate(labels))


@pytest.mark.slow  # 200k items; every item querying (a 200k x 200k kNN) is minutes on 2 cores
def test_import_of_200k_vectors_evaluates_and_searches_without_a_model(tmp_path, capsys):
    vectors, labels = clustered(200_000, 2000, 8)
    np.save(tmp_path / "vectors.npy", vectors)
    write_meta(tmp_path / "meta.csv", labels)
    out = tmp_path / "g"
    code, stdout, err = run(
        capsys, "index", "import", "--vectors", tmp_path / "vectors.npy", "--meta",
        tmp_path / "meta.csv", "--out", out,
    )  # fmt: skip
    assert code == 0, err
    assert "200000 items" in stdout and "no model" in stdout

    # 2,000 sampled queries, each against all 200k items: Recall@1 and MAP@R of the whole
    # gallery's geometry, NMI of all 200k (tests/data/test_metrics.py checks the sample's numbers)
    code, stdout, err = run(
        capsys, "eval", "--gallery", out, "--k", "1", "--queries", "2000", "--json"
    )
    assert code == 0, err
    metrics = json.loads(stdout)
    assert metrics["queries"] == 2000 and 0.7 < metrics["recall@1"] <= 1.0
    assert 0.0 < metrics["map@r"] <= 1.0 and 0.5 < metrics["nmi"] <= 1.0

    code, stdout, err = run(capsys, "search", "--gallery", out, "--id", "7", "--k", "3", "--json")
    assert code == 0, err
    found = json.loads(stdout)
    assert found[0]["id"] == 7 and found[0]["distance"] < 1e-3
    assert all(row["label"] == labels[7] for row in found)

    np.save(tmp_path / "query.npy", vectors[11] * 5)  # any length: normalised
    code, stdout, err = run(capsys, "search", "--gallery", out, "--vector", tmp_path / "query.npy")
    assert code == 0, err
    assert json.loads(run(capsys, "search", "--gallery", out, "--vector", tmp_path / "query.npy",
                          "--json")[1])[0]["id"] == 11  # fmt: skip

    image = tmp_path / "query.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(image)
    code, stdout, err = run(capsys, "search", "--gallery", out, image)
    assert code == 2 and stdout == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "imported without a model" in lines[0], err


def test_import_from_chunk_folders_checks_the_model_dim(setup, tmp_path, capsys):
    vectors, labels = clustered(30, 3, 16)
    folder = tmp_path / "chunks"
    folder.mkdir()
    for part in range(3):  # the chunk format `index build` writes: part-J.npy + part-J.csv
        rows = slice(10 * part, 10 * part + 10)
        np.save(folder / f"part-{part:06d}.npy", vectors[rows])
        write_meta(folder / f"part-{part:06d}.csv", labels[rows])
    out = tmp_path / "g"
    code, _, err = run(capsys, "index", "import", "--vectors", folder, "--meta", folder,
                       "--out", out, "--model", setup["model"])  # fmt: skip
    assert code == 0, err
    with Gallery.open(out) as gallery:
        assert len(gallery) == 30 and gallery.meta["model"] == str(setup["model"])
        np.testing.assert_array_equal(gallery.labels, labels)
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        np.testing.assert_allclose(gallery.embeddings, unit, atol=1e-6)
    eight = tmp_path / "eight.npy"
    np.save(eight, vectors[:, :8])
    code, _, err = run(capsys, "index", "import", "--vectors", eight, "--meta", folder,
                       "--out", tmp_path / "h", "--model", setup["model"])  # fmt: skip
    assert code == 2 and "dim 16 but the vectors have dim 8" in err
    code, _, err = run(capsys, "index", "import", "--vectors", folder / "part-000000.npy",
                       "--meta", folder, "--out", tmp_path / "h")  # fmt: skip
    assert code == 2 and "30 rows but" in err and "10 vectors" in err
    assert not (tmp_path / "h").exists()


# -- appends ---------------------------------------------------------------------------------

ADD_ONE = """
import sys
import numpy as np
from nearsight.index.gallery.core import Gallery

def written() -> int:
    with open("/proc/self/io") as handle:
        return int(dict(line.split(": ") for line in handle.read().splitlines())["wchar"])

vector = np.ones((1, int(sys.argv[2])), np.float32)
vector /= np.linalg.norm(vector)
with Gallery.open(sys.argv[1]) as gallery:
    before = written()
    gallery.add(vector, [{"path": "/new.jpg"}])
    print(written() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_adding_one_item_writes_the_item_not_the_gallery(tmp_path):
    """wchar (bytes passed to write calls) of a process adding one item to a 100k-item
    gallery of 64-d vectors (51 MB of index and embeddings): a segment and a few SQLite pages."""
    count, dim = 100_000, 64
    vectors = np.random.default_rng(0).standard_normal((count, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    folder = write_gallery(
        tmp_path / "g", vectors, [{"path": f"/{i}.jpg"} for i in range(count)], model_sha256=""
    )
    gallery_bytes = sum(p.stat().st_size for p in folder.iterdir())
    script = tmp_path / "add.py"
    script.write_text(ADD_ONE)
    done = subprocess.run(
        [sys.executable, str(script), str(folder), str(dim)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    written = int(done.stdout)
    print(f"adding 1 item to {count} wrote {written} bytes (gallery: {gallery_bytes} bytes)")
    assert written < 64 * 1024 < gallery_bytes // 100
    with Gallery.open(folder) as gallery:
        assert len(gallery) == count + 1 and gallery.items([count])[0]["path"] == "/new.jpg"
    shutil.rmtree(folder)
