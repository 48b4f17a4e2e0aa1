"""A served gallery as the page sees it, without Gradio: its searches
(:class:`~nearsight.app.served.ServedGallery`) plus thumbnails and the gallery's cached
leave-one-out analysis (:mod:`nearsight.index.analysis`).

A :class:`GalleryView` wraps one open :class:`~nearsight.index.gallery.Gallery` and the embedder
that matches it. Its analysis is computed once (the first caller computes it, the others wait)
and cached; the page starts it in a background thread so that the server answers at once.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nearsight.app.served import ServedGallery, class_names  # noqa: F401  (re-exported)
from nearsight.core.errors import NearsightError
from nearsight.index.analysis import ANALYSIS_MAX_ITEMS, Analysis, analyse
from nearsight.index.gallery.core import Gallery
from nearsight.index.images import load_image
from nearsight.index.search.query import Neighbour  # noqa: F401  (re-exported)
from nearsight.index.verdicts import THUMBNAIL_SIDE, thumbnail_uri  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # the serving path does not import torch
    from nearsight.models.embedder import Embedder

THUMBNAIL_CACHE_ITEMS = 4096  # per gallery; ~6 KB each as base64 JPEG


class GalleryView(ServedGallery):
    """A served gallery as the page sees it: its searches (:class:`ServedGallery`) plus
    thumbnails and the cached analysis. Safe to use from several threads."""

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

    # -- thumbnails --------------------------------------------------------------------------

    def thumbnail(self, item_id: int) -> str | None:
        """A small JPEG data URI of a gallery item, or None when its file cannot be read."""
        item_id = int(item_id)
        with self._thumbs_lock:
            if item_id in self._thumbs:
                self._thumbs.move_to_end(item_id)
                return self._thumbs[item_id]
        try:
            uri: str | None = thumbnail_uri(load_image(self.rows[item_id]["path"]))
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


# -- opening galleries with their model --------------------------------------------------------


def open_views(
    gallery_dirs: Sequence[str | os.PathLike[str]],
    model: str | os.PathLike[str] | None = None,
    device: str = "auto",
) -> list[GalleryView]:
    """Open every gallery with the model that embeds its uploads: ``model`` (which must match
    all of them) or the model path each gallery's meta records. One embedder per model file.
    Raises NearsightError (one line) for a missing/damaged gallery or a model that does not
    match."""
    from nearsight.index.gallery.model import foreign_spec
    from nearsight.models.embedder import load_embedder

    embedders: dict[tuple[Path, str], Embedder] = {}
    views: list[GalleryView] = []
    names = gallery_names(gallery_dirs)
    try:
        for name, folder in zip(names, gallery_dirs, strict=True):
            gallery = Gallery.open(folder)
            try:
                path = gallery.model_path(model)
                spec = foreign_spec(gallery)  # a model exported elsewhere runs as recorded
                key = (path.expanduser().resolve(), spec.to_json() if spec else "")
                if key not in embedders:
                    embedders[key] = load_embedder(path, device=device, spec=spec)
                gallery.check_model(embedders[key], path)
            except BaseException:
                gallery.close()
                raise
            views.append(GalleryView(name, gallery, embedders[key]))
    except BaseException:
        for view in views:
            view.close()
        raise
    return views


def gallery_names(gallery_dirs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Short unique names for the dropdown: the folder names, with a parent folder added (or a
    number) where two galleries share a name."""
    paths = [Path(folder).expanduser().absolute() for folder in gallery_dirs]
    plain = [path.name or str(path) for path in paths]
    names = [
        f"{path.parent.name}/{name}" if plain.count(name) > 1 and path.parent.name else name
        for path, name in zip(paths, plain, strict=True)
    ]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique
