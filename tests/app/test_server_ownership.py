"""nearsight owns its server: no private attribute of Gradio's objects is read, no class of
uvicorn, h11, Starlette or Gradio is patched for the process, and inside nearsight/app/ no
import runs back up (serve/ below page/ and rest/, one module above them wiring all three)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import ROOT

APP = ROOT / "nearsight" / "app"
FOREIGN = ("gradio", "uvicorn", "h11", "starlette", "fastapi")
# what serve/ must never import, and what rest/ and page/ must not import of each other
BELOW = {
    "serve": ("page", "rest", "commands", "server_app", "reproduce"),
    "rest": ("page", "commands", "server_app", "reproduce"),
    "page": ("rest", "commands", "server_app", "reproduce"),
}


def _files() -> list[Path]:
    return sorted((ROOT / "nearsight").rglob("*.py"))


def test_no_private_attribute_of_another_object_is_read_in_the_app():
    """`demo._queue` and the like: an attribute with a leading underscore is read only on
    `self` or `cls` (argparse's _SubParsersAction, a type in annotations, is the one name)."""
    found = []
    for path in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and ast.unparse(node.value) not in ("self", "cls")
                    and node.attr != "_SubParsersAction"):  # fmt: skip
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_the_words_of_the_old_launch_are_gone():
    patterns = [r"(?<!self)\._queue\b", r"demo\.galleries\b", r"demo\.concurrency\b", r"demo\.max_queue",
                r"\.server\.config\b", r"\buser_middleware\b", r"\bmiddleware_stack\b",
                r"\bblock_thread\(", r"\.launch\(", r"\bapp_kwargs\b"]  # fmt: skip
    found = [f"{path.relative_to(ROOT)}: {pattern}" for path in _files()
             for pattern in patterns if re.search(pattern, path.read_text())]  # fmt: skip
    assert found == []


def test_no_class_of_the_web_stack_is_assigned_to():
    """No `H11Protocol.data_received = ...`, `gr.Blocks.x = ...`, `setattr(SomeClass, ...)` on
    a name imported from gradio, uvicorn, h11, Starlette or FastAPI."""
    found = []
    for path in _files():
        tree = ast.parse(path.read_text())
        foreign = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                foreign |= {(a.asname or a.name).split(".")[0] for a in node.names
                            if a.name.split(".")[0] in FOREIGN}  # fmt: skip
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FOREIGN:
                foreign |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute | ast.Subscript):
                    root = root.value
                if root is not target and isinstance(root, ast.Name) and root.id in foreign:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(target)}")
    assert found == []


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_import_in_the_app_runs_back_up():
    wrong = []
    for folder, forbidden in BELOW.items():
        for path in sorted((APP / folder).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                if parts[:2] == ["nearsight", "app"] and len(parts) > 2 and parts[2] in forbidden:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == []
    users = [path.relative_to(ROOT) for path in APP.rglob("*.py")
             if path.parent.name != "commands"
             and any(m.startswith("nearsight.app.server_app") for _, m in _imports(path))]  # fmt: skip
    assert users == []  # only the commands (the CLI, above it) start the server
