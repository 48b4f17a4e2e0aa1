"""Import circles across the whole tree (nearsight/ and bench/), counted as an import-graph
tool counts them: every import statement, inside functions and under ``TYPE_CHECKING`` too;
``from a.b import c`` is an edge to module ``a.b.c`` when that is a module, else to ``a.b``.
A circle is a strongly connected component of two or more modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_CIRCLES = 2


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for nearsight/ (``nearsight.x.y``) and bench/ (the scripts import
    each other by their bare names, from bench/ on the path)."""
    names = {}
    for path in sorted((root / "nearsight").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((root / "bench").glob("*.py")):
        names[path.stem] = path
    return names


def imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that file ``path`` (module ``name``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found


def circles(root: Path = ROOT) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm)."""
    modules = module_names(root)
    graph = {name: sorted(imported(path, name, modules)) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_counter_finds_planted_circles(tmp_path):
    """The count is not vacuous: an import inside a function and one under TYPE_CHECKING
    each close a circle."""
    (tmp_path / "nearsight").mkdir()
    (tmp_path / "nearsight" / "__init__.py").write_text("")
    (tmp_path / "nearsight" / "a.py").write_text("def f():\n    from nearsight import b\n")
    (tmp_path / "nearsight" / "b.py").write_text("from nearsight.a import f\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.py").write_text("import typing\nif typing.TYPE_CHECKING:\n"
                                             "    import y\n")  # fmt: skip
    (tmp_path / "bench" / "y.py").write_text("from x import z\n")
    assert sorted(circles(tmp_path)) == [["nearsight.a", "nearsight.b"], ["x", "y"]]


def test_the_whole_tree_has_at_most_two_import_circles():
    found = circles()
    assert len(found) <= MAX_CIRCLES, "\n".join(" <-> ".join(c) for c in found)
