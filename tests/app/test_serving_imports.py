"""The serving path with an ONNX model loads none of the training stack: `nearsight search`,
`eval`, `index build|add|remove` and the page of `serve` run in a fresh interpreter, and the
modules they loaded are checked (`sys.modules` after the command)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TRAINING_STACK = (
    "torch",
    "torchvision",
    "sklearn",
    "scipy",
    "pandas",
    "pytorch_metric_learning",
    "onnx",
    "tensorboard",
)
# Gradio itself imports pandas (its Dataframe and plots): `serve` is checked for the rest.
SERVE_ALLOWED = ("pandas",)

RUN_CLI = """
import json, sys
from nearsight.app.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if "." not in m)}))
"""

RUN_PAGE = """
import json, sys
from nearsight.app.page.layout import build_app
demo = build_app([sys.argv[1]], device="cpu", analyse=False)
page = demo.nearsight
view = page.views[page.names[0]]
assert view.analysis().error is None, view.analysis().error
print(page.api_search(sys.argv[2], 3, None))
print(json.dumps({"code": 0, "modules": sorted(m for m in sys.modules if "." not in m)}))
"""


def loaded_modules(script: str, *args: str | Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr[-2000:]
    return set(report["modules"])


def heavy(modules: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(name for name in TRAINING_STACK if name in modules and name not in allowed)


@pytest.fixture
def gallery_copy(onnx_gallery, tmp_path) -> Path:
    copy = tmp_path / "gallery"
    shutil.copytree(onnx_gallery.gallery, copy)
    return copy


def test_search_loads_no_training_stack(onnx_gallery):
    argv = ["search", "--gallery", onnx_gallery.gallery, onnx_gallery.query, "--json"]
    assert heavy(loaded_modules(RUN_CLI, *argv)) == []


def test_eval_loads_no_training_stack(onnx_gallery):
    argv = ["eval", "--gallery", onnx_gallery.gallery, "--json"]
    assert heavy(loaded_modules(RUN_CLI, *argv)) == []


def test_index_build_add_remove_load_no_training_stack(onnx_gallery, tmp_path, gallery_copy):
    out = tmp_path / "built"
    build = ["index", "build", "--model", onnx_gallery.model, "--dataset", "folder"]
    build += ["--root", onnx_gallery.data, "--split", "all", "--out", out, "--workers", "2"]
    assert heavy(loaded_modules(RUN_CLI, *build)) == []
    add = ["index", "add", "--gallery", gallery_copy, onnx_gallery.query, "--label", "0"]
    assert heavy(loaded_modules(RUN_CLI, *add)) == []
    remove = ["index", "remove", "--gallery", gallery_copy, "--ids", "0"]
    assert heavy(loaded_modules(RUN_CLI, *remove)) == []


def test_serve_page_loads_no_training_stack(onnx_gallery):
    """The page with its leave-one-out analysis and one search; Gradio brings pandas."""
    modules = loaded_modules(RUN_PAGE, onnx_gallery.gallery, onnx_gallery.query)
    assert "gradio" in modules
    assert heavy(modules, allowed=SERVE_ALLOWED) == []


def test_pairwise_rerank_loads_no_training_stack(onnx_gallery, tmp_path):
    """The learned re-ranker runs in onnxruntime: its search loads no torch either."""
    from nearsight.core.digest import file_sha256
    from nearsight.training.pairwise import PairScorer, export_scorer

    reranker = tmp_path / "reranker.onnx"
    export_scorer(PairScorer(8), reranker, file_sha256(onnx_gallery.model))
    spec = f"pairwise:model={reranker},depth=5"
    argv = ["search", "--gallery", onnx_gallery.gallery, onnx_gallery.query, "--rerank", spec]
    assert heavy(loaded_modules(RUN_CLI, *argv, "--json")) == []
    argv = ["eval", "--gallery", onnx_gallery.gallery, "--rerank", spec, "--json"]
    assert heavy(loaded_modules(RUN_CLI, *argv)) == []


def test_a_stage_reranked_image_search_loads_no_training_stack(staged):
    """An image query re-ranked by layer3 features: its stage model (written by rerank
    features) runs in onnxruntime; neither onnx (which wrote it) nor torch is loaded."""
    for spec in (staged["spec"], staged["trained_spec"]):
        argv = ["search", "--gallery", staged["gallery"], staged["query"], "--rerank", spec]
        modules = loaded_modules(RUN_CLI, *argv, "--json")
        assert "onnxruntime" in modules and heavy(modules) == []
