"""The serving path with an ONNX model loads none of the training stack: `nearsight search`,
`eval`, `index build|add|remove` and the page of `serve` run in a fresh interpreter, and the
modules they loaded are checked (`sys.modules` after the command)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

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

# One fresh interpreter runs every command of this file in turn and reports the modules loaded
# after each (an interpreter start costs seconds; these tests ran nine). Modules only pile up, so
# a command's report holds what it and every command before it loaded: a check of it is at least
# as strict as a fresh interpreter's. The page comes last (Gradio brings pandas).
RUN_STEPS = """
import contextlib, io, json, sys
steps = json.loads(sys.argv[1])
reports = {}
for name, kind, args in steps:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if kind == "cli":
            from nearsight.app.cli import main
            code = main(args)
        else:
            from nearsight.app.page.layout import build_app
            demo = build_app([args[0]], device="cpu", analyse=False)
            page = demo.nearsight
            view = page.views[page.names[0]]
            assert view.analysis().error is None, view.analysis().error
            assert json.loads(page.api_search(args[1], 3, None)), "no neighbours"
            page.close()
            code = 0
    reports[name] = {"code": code, "out": out.getvalue()[-2000:],
                     "modules": sorted(m for m in sys.modules if "." not in m)}
    if code != 0:
        break
print(json.dumps(reports))
"""


def heavy(modules: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(name for name in TRAINING_STACK if name in modules and name not in allowed)


@pytest.fixture(scope="module")
def loaded(onnx_gallery, tmp_path_factory, request) -> dict[str, set[str]]:
    """Each step's name -> the modules loaded once it ran (see RUN_STEPS); the steps that need
    torch to be prepared (a re-ranker file) are left out without it."""
    root = tmp_path_factory.mktemp("serving-imports")
    gallery, query, model = onnx_gallery.gallery, onnx_gallery.query, onnx_gallery.model
    copy = root / "gallery"
    shutil.copytree(gallery, copy)
    build = ["index", "build", "--model", model, "--dataset", "folder", "--root",
             onnx_gallery.data, "--split", "all", "--out", root / "built", "--workers", "2"]  # fmt: skip
    steps = [
        ("search", "cli", ["search", "--gallery", gallery, query, "--json"]),
        ("eval", "cli", ["eval", "--gallery", gallery, "--json"]),
        ("build", "cli", build),
        ("add", "cli", ["index", "add", "--gallery", copy, query, "--label", "0"]),
        ("remove", "cli", ["index", "remove", "--gallery", copy, "--ids", "0"]),
    ]
    try:
        import torch  # noqa: F401  (the re-rankers are written with the training stack)
    except ModuleNotFoundError:
        pass
    else:
        from nearsight.core.digest import file_sha256
        from nearsight.training.pairwise import PairScorer, export_scorer

        reranker = root / "reranker.onnx"
        export_scorer(PairScorer(8), reranker, file_sha256(model))
        spec = f"pairwise:model={reranker},depth=5"
        steps += [
            ("pairwise search", "cli", ["search", "--gallery", gallery, query, "--rerank", spec,
                                        "--json"]),
            ("pairwise eval", "cli", ["eval", "--gallery", gallery, "--rerank", spec, "--json"]),
        ]  # fmt: skip
        staged = request.getfixturevalue("staged")
        for which in ("spec", "trained_spec"):
            steps.append((f"stage {which}", "cli", ["search", "--gallery", staged["gallery"],
                          staged["query"], "--rerank", staged[which], "--json"]))  # fmt: skip
    steps.append(("page", "page", [gallery, query]))
    steps = [(name, kind, [str(arg) for arg in args]) for name, kind, args in steps]
    done = subprocess.run([sys.executable, "-c", RUN_STEPS, json.dumps(steps)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    for name, _, _ in steps:
        assert name in reports, f"the step before {name} failed: {reports}"
        assert reports[name]["code"] == 0, (name, reports[name]["out"], done.stderr[-2000:])
    return {name: set(report["modules"]) for name, report in reports.items()}


def step(loaded: dict[str, set[str]], name: str) -> set[str]:
    if name not in loaded:
        pytest.skip("needs torch to write the re-ranker")
    return loaded[name]


def test_search_loads_no_training_stack(loaded):
    assert heavy(step(loaded, "search")) == []


def test_eval_loads_no_training_stack(loaded):
    assert heavy(step(loaded, "eval")) == []


def test_index_build_add_remove_load_no_training_stack(loaded):
    for name in ("build", "add", "remove"):
        assert heavy(step(loaded, name)) == [], name


def test_serve_page_loads_no_training_stack(loaded):
    """The page with its leave-one-out analysis and one search; Gradio brings pandas."""
    modules = step(loaded, "page")
    assert "gradio" in modules
    assert heavy(modules, allowed=SERVE_ALLOWED) == []


def test_pairwise_rerank_loads_no_training_stack(loaded):
    """The learned re-ranker runs in onnxruntime: its search loads no torch either."""
    assert heavy(step(loaded, "pairwise search")) == []
    assert heavy(step(loaded, "pairwise eval")) == []


def test_a_stage_reranked_image_search_loads_no_training_stack(loaded):
    """An image query re-ranked by layer3 features: its stage model (written by rerank
    features) runs in onnxruntime; neither onnx (which wrote it) nor torch is loaded."""
    for which in ("stage spec", "stage trained_spec"):
        modules = step(loaded, which)
        assert "onnxruntime" in modules and heavy(modules) == []
