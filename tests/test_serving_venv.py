"""`pip install nearsight` without `[train]` is enough to serve: a fresh venv holding only the
serving set searches, evaluates and serves an ONNX gallery, and has no torch.

The fresh venv (``python -m venv``, no system site-packages) gets nearsight from a wheel built
from the checkout (installed by pip, no dependencies), and its dependency closure as declared:
each distribution that nearsight's requirements (no extras) reach, recursively, with markers
evaluated and version floors checked against what is installed, linked file by file from the
test's own environment. Pip resolving from PyPI would download ~2 GB of CUDA wheels
(faiss-gpu, onnxruntime-gpu) on every run; the closure walk checks the same thing: that the
declared serving requirements alone make a working installation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

TRAINING_ONLY = ("torch", "torchvision", "sklearn", "scipy", "pytorch_metric_learning", "onnx")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def serving_closure() -> dict[str, metadata.Distribution]:
    """Distributions reached from nearsight's requirements without extras (by canonical name);
    fails when one is missing or older than its declared floor."""
    installed = {canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    found: dict[str, metadata.Distribution] = {}
    todo = [(Requirement(r), "") for r in installed["nearsight"].requires or []]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonical(requirement.name)
        dist = installed.get(name)
        assert dist is not None, f"{requirement} is declared but not installed"
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            f"{requirement}: installed {dist.version}"
        )
        extras = sorted(requirement.extras)
        key = name
        if key in found and not extras:
            continue
        found[key] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            for wanted in ["", *extras]:
                if sub.marker is None or sub.marker.evaluate({"extra": wanted}):
                    todo.append((sub, wanted))
                    break
    return found


def link_distribution(dist: metadata.Distribution, site: Path) -> None:
    """Link every file of ``dist`` that lives in site-packages into ``site``."""
    origin = Path(dist.locate_file("")).resolve()
    for file in dist.files or []:
        source = Path(dist.locate_file(file)).resolve()
        if not source.is_relative_to(origin) or "__pycache__" in file.parts:
            continue  # console scripts in bin/, caches
        target = site / source.relative_to(origin)
        if target.exists() or not source.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)


@pytest.fixture(scope="module")
def serving_venv(tmp_path_factory, nearsight_wheel) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("serving-venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    closure = serving_closure()
    assert "torch" not in closure and "scikit-learn" not in closure
    for name, dist in closure.items():
        if name != "nearsight":
            link_distribution(dist, site)
    wheel = nearsight_wheel
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    yield python
    shutil.rmtree(root, ignore_errors=True)


def run_in_venv(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_serving_venv_has_no_training_stack(serving_venv, tmp_path):
    for module in TRAINING_ONLY:
        done = run_in_venv(serving_venv, "-c", f"import {module}", cwd=tmp_path)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, module
    done = run_in_venv(
        serving_venv, "-c", "import nearsight; print(nearsight.__file__)", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert str(Path(sysconfig.get_paths()["purelib"]).parent) not in done.stdout
    assert "site-packages/nearsight/__init__.py" in done.stdout


@pytest.mark.slow
def test_search_eval_and_the_page_work_in_the_serving_venv(serving_venv, onnx_gallery, tmp_path):
    cli = ["-m", "nearsight.app.cli"]
    gallery, query = str(onnx_gallery.gallery), str(onnx_gallery.query)
    done = run_in_venv(
        serving_venv, *cli, "search", "--gallery", gallery, query, "--json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    hits = json.loads(done.stdout)
    assert len(hits) == 8 and hits[0]["path"] == query and hits[0]["distance"] < 1e-3

    done = run_in_venv(serving_venv, *cli, "eval", "--gallery", gallery, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["queries"] == 12

    page = (
        "import json, sys\n"
        "from nearsight.app.page.layout import build_app\n"
        "demo = build_app([sys.argv[1]], device='cpu', analyse=False)\n"
        "view = demo.nearsight.views[demo.nearsight.names[0]]\n"
        "assert view.analysis().error is None\n"
        "print(demo.nearsight.api_search(sys.argv[2], 3, None))\n"
    )
    done = run_in_venv(serving_venv, "-c", page, gallery, query, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    top = json.loads(done.stdout.strip().splitlines()[-1])[0]["path"]  # below the items' folder
    assert not top.startswith("/") and query.endswith("/" + top)
