"""What the docs point at in code spans: a file of the repository (``nearsight/models/spec.py``,
``tests/app/test_page.py::test_name``, ``nearsight/app/page/layout.py: STATE_SESSIONS = 1000``) exists and
holds the name given after it; a Python name (``nearsight.index.search.query.search_rows``)
imports."""

from __future__ import annotations

import importlib
import re

from tests.docs.usage import ROOT

FOLDERS = ("nearsight/", "tests/", "bench/", "docs/")
PYTHON_NAME = re.compile(r"nearsight(?:\.[A-Za-z_]\w*)+")


def is_reference(text: str) -> bool:
    return text.startswith(FOLDERS) or PYTHON_NAME.match(text) is not None


def check_reference(text: str) -> str | None:
    if text.startswith(FOLDERS):
        return _check_path(text)
    return _check_name(PYTHON_NAME.match(text).group(0))  # type: ignore[union-attr]


def _check_path(text: str) -> str | None:
    """``PATH``, ``PATH::test_name``, ``PATH: NAME = ...`` or ``PATH --flags ...``."""
    first, _, rest = text.partition(" ")
    path, _, test = first.rstrip(":").partition("::")
    file = ROOT / path
    if not file.exists():
        return f"`{text}`: {path} is not in the repository"
    if test and not re.search(rf"\bdef {re.escape(test)}\b", file.read_text()):
        return f"`{text}`: {path} has no {test}"
    if first.endswith(":") and rest:  # PATH: NAME, or PATH: NAME = VALUE
        name, equals, value = (part.strip() for part in rest.partition("="))
        pattern = rf"\b{re.escape(name)}\b"
        if equals:
            pattern = rf"^{re.escape(name)}\b[^=\n]*=\s*{re.escape(value)}\s*(#.*)?$"
        if not re.search(pattern, file.read_text(), re.MULTILINE):
            return f"`{text}`: {path} has no {rest}"
    return None


def _check_name(name: str) -> str | None:
    """The longest importable module of ``name``, then attributes down to its end."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return f"`{name}`: {'.'.join(parts[:cut])} has no {attribute}"
            target = getattr(target, attribute)
        return None
    return f"`{name}` does not import"
