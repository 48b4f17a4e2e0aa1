"""Packaging: one import package, ``nearsight``, a real folder. Its layers import one way
(app -> training | search -> index -> data -> models -> core; training and search are siblings
that never import each other), no import circle crosses a folder, no layer is importable by its bare name (not even
from the repository root), no module is loaded twice under two names, the shipped configs are
reachable through importlib.resources, and a wheel holds nothing but ``nearsight``."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nearsight"
# lowest first: a module may import its own layer and lower ones; equal ranks are siblings,
# which never import each other
RANKS = {"core": 0, "models": 1, "data": 2, "index": 3, "search": 4, "training": 4, "app": 5}
LAYERS = tuple(RANKS)


def run_python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("bare", LAYERS)
def test_layers_are_not_importable_by_their_bare_names_from_the_root(bare):
    done = run_python(f"import {bare}", ROOT)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, done.stderr


def test_nearsight_imports_from_anywhere(tmp_path):
    done = run_python("import nearsight; print(nearsight.__file__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent.name == "nearsight"


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once for every test of the module."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement names, with its line (relative imports resolved)."""
    tree = _parsed(path)
    parts = path.relative_to(ROOT).with_suffix("").parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - node.level]
                module = ".".join((*base, node.module) if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_no_module_imports_a_layer_above_its_own():
    """The layering read from the files alone (what an import graph sees): each module under
    nearsight/<layer>/ imports nearsight.* only from its own layer or a lower one."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue  # nearsight/__init__.py: the public façade, loads lazily from every layer
        layer = parts[0]
        for line, module in _imports(path):
            names = module.split(".")
            other = names[1] if names[0] == "nearsight" and len(names) > 1 else None
            if other in RANKS and other != layer and RANKS[other] >= RANKS[layer]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []


def _module_graph() -> dict[str, set[str]]:
    """module -> the nearsight modules it imports (anywhere in the file, lazily too; imports
    under ``if TYPE_CHECKING:`` are for the type checker only and not counted)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = _parsed(path)
        typing_only = {
            id(child)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in ast.walk(node)
        }
        targets = set()
        for line, module in _imports(path):
            del line
            target = module
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        lines_typing = {getattr(n, "lineno", None) for n in ast.walk(tree) if id(n) in typing_only}
        graph[name] = {
            t
            for t in targets
            if not all(line in lines_typing for line, m in _imports(path) if m.startswith(t))
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_training_and_index_stand_side_by_side():
    """training/ embeds with data/ and models/, never through the gallery store (index/)."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((PACKAGE / "training").rglob("*.py"))
        for line, module in _imports(path)
        if module.startswith("nearsight.index")
    ]
    assert found == []


def test_no_layer_above_models_asks_which_kind_of_trunk_it_has():
    """The trunk family (nearsight/models/trunks.py) answers; ``is_timm`` stays in models/."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "models"
        for line, module in _imports(path)
        if module.endswith((".is_timm", ".timm_info"))
    ]
    assert found == []


def test_no_import_circle_crosses_a_folder_and_few_remain_inside():
    """Modules that import each other, directly or round a circle, lie in one folder, and at
    most 2 such circles remain (each is a place where one module should have been one file)."""
    cycles = _cycles(_module_graph())
    crossing = [c for c in cycles if len({m.rsplit(".", 1)[0] for m in c}) > 1]
    assert crossing == []
    assert len(cycles) <= 2, cycles


def test_every_nearsight_import_resolves_to_a_file():
    """What pyright or an IDE does without installing: nearsight.a.b is nearsight/a/b.py or
    nearsight/a/b/__init__.py (or a name defined in such a module)."""
    unresolved = []
    for path in sorted(
        [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    ):
        for line, module in _imports(path):
            names = module.split(".")
            if names[0] != "nearsight":
                continue
            # the longest prefix that is a file or package; the rest may be a name inside it
            for end in range(len(names), 0, -1):
                base = ROOT.joinpath(*names[:end])
                if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
                    break
            else:
                unresolved.append(f"{path.relative_to(ROOT)}:{line} {module}")
                continue
            if len(names) - end > 1:
                unresolved.append(f"{path.relative_to(ROOT)}:{line} {module}")
    assert unresolved == []


def test_no_module_is_loaded_twice_under_two_names():
    """Import every nearsight module from the repository root, then check that each source file
    is one module only."""
    code = """
import importlib, json, pkgutil, sys
import nearsight
names = [m.name for m in pkgutil.walk_packages(nearsight.__path__, "nearsight.")]
for name in names:
    importlib.import_module(name)
files = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and "/nearsight/" in path and "/.venv/" not in path:
        files.setdefault(path, []).append(name)
print(json.dumps({"files": files, "count": len(names)}))
"""
    done = run_python(code, ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["count"] > 60  # every sub-package was walked
    twice = {path: names for path, names in report["files"].items() if len(names) > 1}
    assert twice == {}


def test_shipped_configs_load_by_name_from_anywhere(tmp_path):
    code = """
from nearsight.training.config import load_config, shipped_configs
names = shipped_configs()
assert "rll_cub" in names and len(names) >= 18, names
print(load_config("rll_cub").loss.name, load_config("ice_sop.yaml").loss.name)
"""
    done = run_python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["rll", "ice"]


@pytest.mark.slow
def test_wheel_holds_only_the_nearsight_package(nearsight_wheel):
    with zipfile.ZipFile(nearsight_wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"nearsight"}
    for package in LAYERS:
        assert f"nearsight/{package}/__init__.py" in names
    sources = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")}
    assert sources - set(names) == set(), "modules missing from the wheel"
    assert "nearsight/training/configs/rll_cub.yaml" in names
    assert not any(name.startswith("nearsight/tests") for name in names)
