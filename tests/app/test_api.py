"""The Python API (`import nearsight`): lazy entry points, open_gallery's search / evaluate /
len on a real ONNX gallery, export. (docs/api.md's example runs as a doc test: tests/docs/.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import nearsight
from nearsight.core.errors import NearsightError
from nearsight.search.evaluate import evaluate_gallery


def test_import_nearsight_loads_no_runtime(tmp_path):
    code = (
        "import json, sys, nearsight\n"
        "print(json.dumps(sorted(m for m in ('torch', 'onnxruntime', 'faiss', 'gradio', "
        "'numpy', 'PIL') if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_public_names():
    assert set(nearsight.__all__) >= {"open_gallery", "load_embedder", "export", "train"}
    with pytest.raises(AttributeError):
        nearsight.no_such_function  # noqa: B018


def test_open_gallery_searches_paths_images_and_arrays(onnx_gallery):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        assert len(gallery) == 12
        by_path = gallery.search(onnx_gallery.query, k=3)
        pixels = np.asarray(Image.open(onnx_gallery.query).convert("RGB"))
        by_image = gallery.search(Image.fromarray(pixels), k=3)
        by_array = gallery.search(pixels, k=3)
        by_floats = gallery.search(pixels.astype(np.float32) / 255.0, k=3)
        rows = gallery.gallery.all_items()
    assert by_image == by_array == by_floats  # the same pixels, embedded
    assert [hit.id for hit in by_path] == [hit.id for hit in by_image]
    np.testing.assert_allclose(
        [h.distance for h in by_path], [h.distance for h in by_image], atol=1e-5
    )
    assert [hit["rank"] for hit in by_path] == [1, 2, 3]
    assert set(by_path[0]) == {
        "rank",
        "id",
        "key",
        "path",
        "label",
        "class_name",
        "distance",
        "meta",
    }
    # a gallery file is searched as that item: first, at distance exactly 0
    own = next(row for row in rows if Path(row["path"]) == onnx_gallery.query)
    assert by_path[0]["id"] == own["id"] and by_path[0]["distance"] == 0.0
    distances = [hit["distance"] for hit in by_path]
    assert distances == sorted(distances)


def test_search_agrees_with_the_cli(onnx_gallery, capsys):
    from nearsight.app.cli import main

    argv = ["search", "--gallery", str(onnx_gallery.gallery), str(onnx_gallery.query)]
    assert main([*argv, "--k", "4", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    # the CLI's one query loads the lighter onnxruntime session: the same as the API's with it
    with nearsight.open_gallery(onnx_gallery.gallery, optimization="extended") as gallery:
        api = gallery.search(onnx_gallery.query, k=4)
    same = [{key: hit[key] for key in cli[0] if key != "distance"} for hit in api]
    assert [{k: v for k, v in row.items() if k != "distance"} for row in cli] == same
    np.testing.assert_allclose(
        [r["distance"] for r in cli], [h["distance"] for h in api], atol=1e-5
    )
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:  # all optimisations
        fastest = gallery.search(onnx_gallery.query, k=4)
    assert [hit["id"] for hit in fastest] == [hit["id"] for hit in cli]
    np.testing.assert_allclose(
        [hit["distance"] for hit in fastest], [hit["distance"] for hit in cli], atol=1e-5
    )


def test_evaluate_is_the_gallery_evaluation(onnx_gallery):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        metrics = gallery.evaluate()
        assert metrics == evaluate_gallery(gallery.gallery)
        assert gallery._embedder is None  # evaluation needs no model
    assert metrics["queries"] == 12 and 0.0 <= metrics["recall@1"] <= 1.0


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("missing.png", "no such file"),
        (np.zeros((4, 4, 2), np.uint8), "an image array must be"),
        (np.zeros((4, 4, 3), np.int64), "uint8 or float"),
        (42, "a query image is a file path"),
    ],
)
def test_bad_queries_are_one_line_errors(onnx_gallery, query, message):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        with pytest.raises(NearsightError, match=message) as caught:
            gallery.search(query)
        assert "\n" not in str(caught.value)
        with pytest.raises(NearsightError, match="k must be"):
            gallery.search(onnx_gallery.query, k=0)


def test_missing_gallery_is_a_one_line_error(tmp_path):
    with pytest.raises(NearsightError):
        nearsight.open_gallery(tmp_path / "nowhere")


def test_load_embedder_and_export(onnx_gallery, tmp_path):
    out = tmp_path / "again.onnx"
    report = nearsight.export(onnx_gallery.checkpoint, out)
    assert report.path == out and out.is_file() and report.max_abs_diff <= 1e-4
    embedder = nearsight.load_embedder(out)
    vectors = embedder.embed_images([Image.open(onnx_gallery.query).convert("RGB")])
    assert vectors.shape == (1, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    with pytest.raises(NearsightError, match=".onnx file"):
        nearsight.export(onnx_gallery.checkpoint, tmp_path / "model.bin")


def test_train_is_reexported_from_training_run():
    try:
        import nearsight.training.run as run
    except ModuleNotFoundError:
        pytest.skip("nearsight/training/run.py (the `train` branch) is not merged yet")
    assert nearsight.train is run.train


def test_open_gallery_filters_and_searches_by_vector_and_item(onnx_gallery):
    with nearsight.open_gallery(onnx_gallery.gallery) as gallery:
        rows = gallery.gallery.all_items()
        label = rows[0]["label"]
        same = [row["id"] for row in rows if row["label"] == label]
        hits = gallery.search(onnx_gallery.query, k=3, filters=f"label={label}")
        assert len(hits) == min(3, len(same)) and all(h["label"] == label for h in hits)
        by_item = gallery.search_item(rows[0]["id"], k=3)
        assert by_item[0]["id"] == rows[0]["id"] and len(by_item) == 3
        vector = np.asarray(gallery.gallery.embeddings[0]) * 5.0  # any length: a direction
        by_vector = gallery.search_vector(vector, k=3)
        assert [h["id"] for h in by_vector] == [h["id"] for h in by_item]
        with pytest.raises(nearsight.NearsightError, match="numbers"):
            gallery.search_vector([1.0, 2.0], k=2)
