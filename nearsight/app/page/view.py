"""One gallery as the page sees it, without Gradio: the served gallery
(:class:`nearsight.search.served.ServedGallery`: searches by image or by item, public
paths) plus thumbnails and the gallery's cached leave-one-out analysis
(:mod:`nearsight.search.analysis`).

The analysis is computed once (the first caller computes it, the others wait) and cached; the
page starts it in a background thread so that the server answers at once.

A gallery item picked as the query is left out of its own results (leave-one-out, as the
evaluation does: by id, so an exact duplicate of it still counts as a neighbour). An uploaded
image is not left out of anything: an upload of a gallery file is searched as that item, which
comes first at distance 0.

Where the gallery records a group column (``--group-column``, a SKU), the page's grids are
grouped by it: :meth:`GalleryView.search_one` answers one card per product, its best photo
(nearsight/app/page/products.py), and so does the page's ``/search`` endpoint.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Unpack

import numpy as np

from nearsight.app.page.html import QueryCard, result_html, title_columns
from nearsight.app.page.products import grid_hits
from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import fit_file
from nearsight.index.gallery.core import Gallery
from nearsight.models.embedder import Embedder
from nearsight.search.analysis import ANALYSIS_MAX_ITEMS, Analysis, analyse
from nearsight.search.neighbour import Neighbour
from nearsight.search.route import Filtered
from nearsight.search.served import OneQuery, ServedGallery, open_served
from nearsight.search.verdicts import THUMBNAIL_SIDE, thumbnail_uri

THUMBNAIL_CACHE_ITEMS = 4096  # per gallery; ~6 KB each as base64 JPEG


class GalleryView(ServedGallery):
    """A served gallery with the page's thumbnails and analysis. Safe to use from several
    threads."""

    def __init__(
        self,
        name: str,
        gallery: Gallery,
        embedder: Embedder,
        analysis_max_items: int = ANALYSIS_MAX_ITEMS,
    ):
        super().__init__(name, gallery, embedder)
        self.analysis_max_items = analysis_max_items
        self._thumbs: OrderedDict[int, str | None] = OrderedDict()
        self._thumbs_lock = threading.Lock()
        self._analysis: Analysis | None = None
        self._analysis_lock = threading.Lock()

    def _same_kind(self, gallery: Gallery) -> GalleryView:
        return GalleryView(self.name, gallery, self.embedder, self.analysis_max_items)

    def search_one(self, vector: np.ndarray, k: int, **query: Unpack[OneQuery]) -> list[Neighbour]:
        """The first page of the page's grid: the k nearest items, or, where the gallery
        records a group column, the k nearest products (module docstring)."""
        return grid_hits(self, vector, k, 0, **query)

    # -- thumbnails --------------------------------------------------------------------------

    def thumbnail(self, item_id: int) -> str | None:
        """A small JPEG data URI of a gallery item, or None when its file cannot be read."""
        item_id = int(item_id)
        with self._thumbs_lock:
            if item_id in self._thumbs:
                self._thumbs.move_to_end(item_id)
                return self._thumbs[item_id]
        try:
            # in the decode box too: a gallery's files came from folders, and may have changed
            small = fit_file(self.row(item_id)["path"], THUMBNAIL_SIDE).image
            uri: str | None = thumbnail_uri(small)
        except NearsightError:
            uri = None  # moved or unreadable since the gallery was built: a placeholder
        with self._thumbs_lock:
            self._thumbs[item_id] = uri
            while len(self._thumbs) > THUMBNAIL_CACHE_ITEMS:
                self._thumbs.popitem(last=False)
        return uri

    # -- analysis ----------------------------------------------------------------------------

    @property
    def analysis_ready(self) -> bool:
        return self._analysis is not None

    def analysis(self) -> Analysis:
        """The leave-one-out analysis, computed on first use (other callers wait for it)."""
        if self._analysis is None:
            with self._analysis_lock:
                if self._analysis is None:
                    self._analysis = analyse(self.gallery, self.analysis_max_items)
        return self._analysis

    def result_grid(self, card: QueryCard, hits: list[Neighbour], filtered: Filtered) -> str:
        """The result grid of ``hits`` for the query ``card``, its fields led as this gallery
        shows them (the first page and the More button's pages alike)."""
        return result_html(
            card,
            hits,
            [self.thumbnail(hit.id) for hit in hits],
            [self.class_name(hit.label) for hit in hits],
            gallery=self.name,
            gallery_size=len(self),
            matching=None if filtered.allowed is None else len(filtered.allowed),
            lead_fields=self.shown_fields(),
            filtered_fields=filtered.keys,
            title_fields=title_columns(self.gallery.column_types()),
        )


def open_views(
    gallery_dirs: Sequence[str | os.PathLike[str]],
    model: str | os.PathLike[str] | None = None,
    device: str = "auto",
) -> list[GalleryView]:
    """:func:`~nearsight.search.served.open_served`, as the page's views."""
    return open_served(gallery_dirs, model, device, kind=GalleryView)
