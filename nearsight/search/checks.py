"""The one check of ``k`` (how many neighbours), for every way of asking: the CLI, REST, the
page and the Python API."""

from __future__ import annotations

from typing import Any

from nearsight.core.errors import NearsightError

DEFAULT_K = 8  # neighbours shown when a request names no k (CLI, REST, the page)


def check_k(k: Any, most: int | None = None) -> int:
    """``k`` as an int: a whole number of at least 1 (and at most ``most``), else a one-line
    NearsightError. ``5.0`` counts as 5 (sliders send floats); ``True`` does not."""
    span = "of at least 1" if most is None else f"from 1 to {most}"
    try:
        value = int(k)
        whole = not isinstance(k, bool) and float(k) == value
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < 1 or (most is not None and value > most):
        raise NearsightError(f"k must be a whole number {span}, got {k!r}")
    return value


def check_offset(offset: Any, most: int | None = None) -> int:
    """A page's ``offset`` (how many ranks come before it) as an int: a whole number of at
    least 0 (and at most ``most``), else a one-line NearsightError."""
    span = "of at least 0" if most is None else f"from 0 to {most}"
    try:
        value = int(offset)
        whole = not isinstance(offset, bool) and float(offset) == value
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < 0 or (most is not None and value > most):
        raise NearsightError(f"offset must be a whole number {span}, got {offset!r}")
    return value
