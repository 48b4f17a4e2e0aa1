"""A query's class as a caller gives it: a label number, or a class name of the gallery."""

from __future__ import annotations

import re

import numpy as np

from nearsight.core.errors import NearsightError, closest_names
from nearsight.index.gallery.core import Gallery


def query_label(gallery: Gallery, label: int | str | None) -> int | None:
    """``label`` as the gallery's label number: a number as it is, a class name by the
    gallery's names (a one-line error naming the closest ones when it has no such class)."""
    if label is None:
        return None
    if isinstance(label, bool):
        raise NearsightError(f"a label is a number or a class name, not {label!r}")
    if isinstance(label, int | np.integer):
        return int(label)
    text = str(label).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    names = gallery.class_names()
    for number, name in names.items():
        if name == text:
            return number
    raise NearsightError(
        f"the gallery has no class named {text!r}: {closest_names(text, names.values())}"
    )
