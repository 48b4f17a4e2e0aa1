"""Failure inspection over a gallery's stored embeddings, as pandas DataFrames: the
leave-one-out failures and a self-contained HTML report of them, two galleries of the same
items compared, suspected wrong labels, duplicate images, and where in two images their
similarity comes from. ``nearsight inspect`` is a thin layer over these functions; each takes
a gallery folder or an open :class:`~nearsight.index.gallery.core.Gallery`."""

from __future__ import annotations

from nearsight.search.inspect.compare import Comparison, compare_galleries
from nearsight.search.inspect.duplicates import Duplicates, find_duplicates
from nearsight.search.inspect.explain import Explanation, draw, explain_pair, picture
from nearsight.search.inspect.failures import FailureReport, inspect_failures
from nearsight.search.inspect.labels import suspected_labels
from nearsight.search.inspect.report import write_report

__all__ = [
    "Comparison",
    "Duplicates",
    "Explanation",
    "FailureReport",
    "compare_galleries",
    "draw",
    "explain_pair",
    "find_duplicates",
    "inspect_failures",
    "picture",
    "suspected_labels",
    "write_report",
]
