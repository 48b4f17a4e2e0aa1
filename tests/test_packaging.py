"""Packaging: one import package, ``nearsight``. The repository's folders models/, index/,
training/ and app/ are mapped into it (pyproject's package-dir); none of them is importable by
its bare name, no module is loaded twice under two names, every sub-package is listed, and a
wheel holds nothing but ``nearsight`` at its top level."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"models": "nearsight.models", "index": "nearsight.index", "training": "nearsight.training",
          "app": "nearsight.app"}  # fmt: skip


def run_python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("bare", sorted(MAPPED))
def test_folders_are_not_importable_by_their_bare_names(bare, tmp_path):
    done = run_python(f"import {bare}", tmp_path)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, done.stderr


def test_nearsight_imports_from_anywhere(tmp_path):
    done = run_python("import nearsight; print(nearsight.__version__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_no_module_is_loaded_twice_under_two_names(tmp_path):
    """Import every nearsight module, then check that each source file is one module only and
    that no bare folder name crept into sys.modules."""
    code = """
import importlib, json, pkgutil, sys
ROOT = sys.argv[1]
import nearsight
names = [m.name for m in pkgutil.walk_packages(nearsight.__path__, "nearsight.")]
for sub in ("models", "index", "training", "app"):
    package = importlib.import_module("nearsight." + sub)
    names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
files = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    ours = path and path.startswith(ROOT) and "/.venv/" not in path
    if ours or name.split(".")[0] == "nearsight":
        files.setdefault(path, []).append(name)
print(json.dumps({"files": files, "count": len(names)}))
"""
    done = run_python(code, tmp_path, str(ROOT))
    assert done.returncode == 0, done.stderr[-2000:]

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["count"] > 30  # every sub-package was walked
    twice = {path: names for path, names in report["files"].items() if len(names) > 1}
    assert twice == {}
    loaded = {name for names in report["files"].values() for name in names}
    assert not any(name.split(".")[0] in MAPPED for name in loaded)


def test_every_sub_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = {package: folder for folder, package in MAPPED.items()}
    assert config["package-dir"] == {"nearsight": "nearsight", **mapping}
    found = {"nearsight"}
    for folder, package in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert found - listed == set(), "sub-packages missing from [tool.setuptools] packages"
    assert listed - found == set(), "listed packages with no folder"


def test_module_walk_sees_every_folder():
    """pkgutil (what the test above walks) finds every sub-package through the mapping."""
    import nearsight.app
    import nearsight.index
    import nearsight.models
    import nearsight.training

    for package in (nearsight.models, nearsight.index, nearsight.training, nearsight.app):
        assert [Path(p).resolve() for p in package.__path__] == [
            (ROOT / package.__name__.split(".")[1]).resolve()
        ]
        assert list(pkgutil.iter_modules(package.__path__))


@pytest.mark.slow
def test_wheel_holds_only_the_nearsight_package(nearsight_wheel):
    wheel = nearsight_wheel
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"nearsight"}
    for package in ("models", "index", "training", "app"):
        assert f"nearsight/{package}/__init__.py" in names
    assert "nearsight/training/configs/default.yaml" in names or any(
        name.startswith("nearsight/training/configs/") for name in names
    )
    assert not any(name.startswith("nearsight/tests") for name in names)
