"""Facets of a filtered gallery, the one function behind every face (``nearsight index
facets``, REST ``GET /api/facets``, Python ``Searcher.facets``): the filter is checked as a
search checks it (nearsight/search/route.py), then the allowed items are counted column by
column (nearsight/index/catalog/facets.py)."""

from __future__ import annotations

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.facets import BINS, TOP_VALUES, Facets
from nearsight.index.gallery.core import Gallery
from nearsight.search import route
from nearsight.search.route import Filters

MAX_TOP, MAX_BINS = 1000, 200


def gallery_facets(
    gallery: Gallery,
    filters: Filters = None,
    top: int = TOP_VALUES,
    bins: int = BINS,
    max_conditions: int | None = None,
) -> Facets:
    """The facets of the items ``filters`` allow, with notes on filter values no item holds."""
    if not 1 <= top <= MAX_TOP:
        raise NearsightError(f"top must be 1-{MAX_TOP}, got {top}")
    if not 1 <= bins <= MAX_BINS:
        raise NearsightError(f"bins must be 1-{MAX_BINS}, got {bins}")
    checked = route.check_filters(gallery, filters, max_conditions)
    found = gallery.facet_summary(checked.allowed, top, bins)
    found.notes = list(checked.notes)
    return found
