"""The one gallery builder, called directly (nearsight.index.gallery.build.build_gallery): it
builds, resumes a build killed part way, and shards under torchrun; every route that builds a
gallery (CLI, Python API, demo) writes the same meta through it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import torchrun as launch_torchrun

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.build import BuildReport, build_gallery, import_gallery
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.sources import dataset_source, images_source
from nearsight.models.loading import load_embedder
from nearsight.models.spec import SPEC_KEY

# a script that builds the gallery of the test's data in chunks of 2 (one rank's part under
# torchrun) and, with KILL_AFTER set, SIGKILLs itself once that many chunks are on disk
BUILD_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    from nearsight.index import chunks
    from nearsight.index.gallery import build
    from nearsight.index.gallery.sources import dataset_source
    from nearsight.models.loading import load_embedder

    model, data, out = sys.argv[1:4]
    kill_after = int(os.environ.get("KILL_AFTER", "0"))
    written = []
    write_chunk = chunks.write_chunk

    def write_then_maybe_die(*args, **kwargs):
        write_chunk(*args, **kwargs)
        written.append(args[1])
        if kill_after and len(written) == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    build.write_chunk = write_then_maybe_die
    source = dataset_source("folder", data, "all")
    report = build.build_gallery(load_embedder(model, device="cpu"), source, out,
                                 model_path=model, chunk_size=2)
    print(json.dumps({"rank": report.rank, "embedded": report.chunks_embedded,
                      "reused": report.chunks_reused, "items": report.items}))
    """
)


def _run_script(tmp_path: Path, args: list[str], env: dict[str, str], torchrun: bool = False):
    script = tmp_path / "build_script.py"
    script.write_text(BUILD_SCRIPT)
    run = {"env": {**os.environ, **env}, "capture_output": True, "text": True, "timeout": 600}
    if torchrun:
        return launch_torchrun([str(script), *args], tmp_path / "tmp", **run)
    return subprocess.run([sys.executable, str(script), *args], **run)


def _contents(folder: Path) -> tuple[list[str], np.ndarray]:
    with Gallery.open(folder) as gallery:
        rows = gallery.all_items()
        return [row["path"] for row in rows], gallery.vectors_of([row["id"] for row in rows])


@pytest.fixture(scope="module")
def clean(onnx_gallery, tmp_path_factory) -> tuple[Path, BuildReport]:
    out = tmp_path_factory.mktemp("clean") / "gallery"
    report = build_gallery(
        load_embedder(onnx_gallery.model, device="cpu"),
        dataset_source("folder", onnx_gallery.data, "all"),
        out,
        model_path=onnx_gallery.model,
        chunk_size=2,
    )
    return out, report


def test_it_builds_and_reports_what_it_did(onnx_gallery, clean):
    out, report = clean
    assert report.out == out and report.wrote_gallery
    assert (report.items, report.skipped, report.chunks_embedded, report.chunks_reused) == (
        12, 0, 6, 0)  # fmt: skip
    assert report.index_type == "flat" and report.kept_chunks is None
    assert report.summary().startswith(f"built gallery {out}: 12 items, flat index")
    with Gallery.open(out) as gallery:
        assert gallery.meta["model"] == str(onnx_gallery.model)
        assert gallery.meta[SPEC_KEY]["dim"] == 8  # the spec, written one way
        assert "image_size" not in gallery.meta and "resize" not in gallery.meta
    assert not out.with_name(".gallery.chunks").exists()
    paths, vectors = _contents(out)
    cli_paths, cli_vectors = _contents(onnx_gallery.gallery)  # conftest built it by the CLI
    assert paths == cli_paths and np.allclose(vectors, cli_vectors, atol=1e-6)


def test_a_killed_build_resumes_from_its_finished_chunks(onnx_gallery, clean, tmp_path):
    out = tmp_path / "gallery"
    args = [str(onnx_gallery.model), str(onnx_gallery.data), str(out)]
    killed = _run_script(tmp_path, args, {"KILL_AFTER": "3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()
    assert len(list(out.with_name(".gallery.chunks").glob("part-*.csv"))) == 3
    resumed = _run_script(tmp_path, args, {})
    assert resumed.returncode == 0, resumed.stderr
    said = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert (said["reused"], said["embedded"], said["items"]) == (3, 3, 12)
    paths, vectors = _contents(out)
    clean_paths, clean_vectors = _contents(clean[0])
    assert paths == clean_paths and np.array_equal(vectors, clean_vectors)


def test_torchrun_shards_the_chunks_and_gives_the_same_gallery(onnx_gallery, clean, tmp_path):
    out = tmp_path / "gallery"
    ran = _run_script(
        tmp_path,
        [str(onnx_gallery.model), str(onnx_gallery.data), str(out)],
        {"OMP_NUM_THREADS": "1"},
        torchrun=True,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    reports = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["embedded"]) for r in reports) == [(0, 3), (1, 3)]
    paths, vectors = _contents(out)
    clean_paths, clean_vectors = _contents(clean[0])
    assert paths == clean_paths and np.allclose(vectors, clean_vectors, atol=1e-6)


def test_a_bad_index_type_fails_before_embedding(onnx_gallery, tmp_path):
    from nearsight.core.errors import NearsightError

    with pytest.raises(NearsightError, match="unknown index type 'bogus'"):
        build_gallery(
            load_embedder(onnx_gallery.model, device="cpu"),
            dataset_source("folder", onnx_gallery.data, "all"),
            tmp_path / "g",
            model_path=onnx_gallery.model,
            index_type="bogus",
        )
    assert not (tmp_path / ".g.chunks").exists()


def test_an_unreadable_image_is_skipped_and_counted(onnx_gallery, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    paths = [onnx_gallery.query, bad]
    report = build_gallery(load_embedder(onnx_gallery.model, device="cpu"), images_source(paths),
                           tmp_path / "g", model_path=onnx_gallery.model)  # fmt: skip
    assert (report.items, report.skipped) == (1, 1)
    with Gallery.open(tmp_path / "g") as gallery:
        assert [row["path"] for row in gallery.all_items()] == [str(onnx_gallery.query)]


def test_import_writes_the_model_meta_a_build_writes_and_checks_the_dim(onnx_gallery, clean,
                                                                        tmp_path):  # fmt: skip
    """Vectors embedded elsewhere: the same model meta as a build; a model of another dim is
    refused before anything is written."""
    out, _ = clean
    paths, vectors = _contents(out)
    rows = [{"path": path} for path in paths]
    embedder = load_embedder(onnx_gallery.model, device="cpu")
    report = import_gallery(vectors, rows, tmp_path / "g", vectors_path=tmp_path / "v.npy",
                            embedder=embedder, model_path=onnx_gallery.model)  # fmt: skip
    assert (report.items, report.dim, report.index_type) == (12, 8, "flat")
    with Gallery.open(tmp_path / "g") as imported, Gallery.open(out) as built:
        assert imported.meta[SPEC_KEY] == built.meta[SPEC_KEY]
        assert imported.meta["model"] == built.meta["model"]
        assert imported.model_sha256 == built.model_sha256
    with pytest.raises(NearsightError, match="embeds in dim 8 but the vectors have dim 4"):
        import_gallery(vectors[:, :4], rows, tmp_path / "h", vectors_path=tmp_path / "v.npy",
                       embedder=embedder, model_path=onnx_gallery.model)  # fmt: skip
    assert not (tmp_path / "h").exists()
