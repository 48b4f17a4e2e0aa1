"""No module under nearsight/ is over :data:`MAX_LINES` lines: one responsibility per file, each
short enough to read whole."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def line_counts(root: Path = ROOT) -> dict[str, int]:
    """Each module under nearsight/ (its path from the repository root) -> its line count."""
    return {
        path.relative_to(root).as_posix(): len(path.read_text().splitlines())
        for path in sorted((root / "nearsight").rglob("*.py"))
    }


def test_no_module_is_over_the_line_limit():
    over = {path: count for path, count in line_counts().items() if count > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines (split along a real seam): {over}"


def test_the_count_sees_a_long_module(tmp_path):
    """The check reads real files: a module of MAX_LINES + 1 lines is counted as such."""
    package = tmp_path / "nearsight" / "index"
    package.mkdir(parents=True)
    (package / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    counts = line_counts(tmp_path)
    assert counts == {
        "nearsight/index/long.py": MAX_LINES + 1,
        "nearsight/index/short.py": MAX_LINES,
    }
