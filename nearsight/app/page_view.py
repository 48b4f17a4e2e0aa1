"""One gallery as the page (and any other front end) sees it, without Gradio: searches by image
or by item, thumbnails, and the gallery's cached leave-one-out analysis
(:mod:`nearsight.index.analysis`).

A :class:`GalleryView` wraps one open :class:`~nearsight.index.gallery.Gallery` and the embedder
that matches it. Its analysis is computed once (the first caller computes it, the others wait)
and cached; the page starts it in a background thread so that the server answers at once.

A gallery item used as a query is left out of its own results (by id, so an exact duplicate of
it still counts as a neighbour). An uploaded image is not a gallery item and nothing is removed
from its results: an upload of a gallery file finds that item at distance 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from PIL import Image

from nearsight.core.errors import NearsightError
from nearsight.index.analysis import ANALYSIS_MAX_ITEMS, Analysis, analyse
from nearsight.index.gallery.core import Gallery
from nearsight.index.images import load_image
from nearsight.index.rerank.spec import RerankSpec
from nearsight.index.search.query import allowed_ids
from nearsight.index.verdicts import THUMBNAIL_SIDE, thumbnail_uri  # noqa: F401  (re-exported)

THUMBNAIL_CACHE_ITEMS = 4096  # per gallery; ~6 KB each as base64 JPEG


@dataclass
class Neighbour:
    rank: int
    id: int
    path: str
    label: int | None
    class_name: str | None
    distance: float | None  # None where an approximate index found fewer than k
    meta: dict[str, Any] = field(default_factory=dict)  # the item's extra columns

    def as_json(self) -> dict[str, Any]:
        """The shape `nearsight search --json` prints (nearsight/index/search/query.py)."""
        return {
            "id": self.id,
            "path": self.path,
            "label": self.label,
            "class_name": self.class_name,
            "distance": self.distance,
            "meta": dict(self.meta),
        }


class GalleryView:
    """One gallery as the page sees it: catalog rows in memory, the embedder, thumbnails and
    the cached analysis. Safe to use from several threads."""

    def __init__(
        self,
        name: str,
        gallery: Gallery,
        embedder: Any,
        analysis_max_items: int = ANALYSIS_MAX_ITEMS,
    ):
        self.name = name
        self.analysis_max_items = analysis_max_items
        self.generation = 0  # counts the reloads of a live gallery (nearsight/app/live.py)
        self.show_paths = False  # clients see paths below the items' common folder only
        self.rerank_override: RerankSpec | None = None  # serve --rerank
        self.gallery = gallery
        self.embedder = embedder
        self.rows: dict[int, dict[str, Any]] = {int(r["id"]): r for r in gallery.all_items()}
        self.ids = np.asarray(gallery.ids, dtype=np.int64)
        self.labels = np.asarray(gallery.labels, dtype=np.int64)
        self.position = {int(item_id): row for row, item_id in enumerate(self.ids)}
        self.class_names = class_names(self.rows.values())
        self.by_sha256: dict[str, int] = {}
        for item_id, row in self.rows.items():
            if row.get("sha256"):
                self.by_sha256.setdefault(str(row["sha256"]), item_id)
        folders = {os.path.dirname(str(row["path"])) for row in self.rows.values()}
        self._root = os.path.commonpath(sorted(folders)) if folders else ""
        self._thumbs: OrderedDict[int, str | None] = OrderedDict()
        self._thumbs_lock = threading.Lock()
        self._analysis: Analysis | None = None
        self._analysis_lock = threading.Lock()

    # -- facts -------------------------------------------------------------------------------

    @property
    def rerank(self) -> RerankSpec:
        """The re-ranking searches use unless told otherwise: serve --rerank, else the
        gallery's stored choice (nearsight eval --tune-on ... --save), else none."""
        if self.rerank_override is not None:
            return self.rerank_override
        return self.gallery.default_rerank

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def labelled_ids(self) -> np.ndarray:
        return self.ids[self.labels >= 0]

    def class_name(self, label: int | None) -> str:
        if label is None or label < 0:
            return "unknown"
        return self.class_names.get(int(label), f"class {label}")

    def label_of(self, item_id: int) -> int | None:
        row = self.row(item_id)
        return None if row["label"] is None else int(row["label"])

    def row(self, item_id: int) -> dict[str, Any]:
        try:
            return self.rows[int(item_id)]
        except KeyError:
            raise NearsightError(f"gallery {self.name} has no item with id {item_id}") from None

    def public_path(self, path: str | os.PathLike[str]) -> str:
        """An item's path as clients see it: below the gallery items' common folder, so the
        server's own folders stay private (absolute with ``serve --show-paths``)."""
        text = str(path)
        if self.show_paths or not self._root:
            return text
        return os.path.relpath(text, self._root)

    def public_row(self, item_id: int) -> dict[str, Any]:
        """The item's catalog row with :meth:`public_path`."""
        return {**self.row(item_id), "path": self.public_path(self.row(item_id)["path"])}

    def identical_item(self, data: bytes) -> int | None:
        """The id of a gallery item whose file has exactly these bytes, if any."""
        return self.by_sha256.get(hashlib.sha256(data).hexdigest())

    # -- searching ---------------------------------------------------------------------------

    def embed(self, image: Image.Image) -> np.ndarray:
        return np.asarray(self.embedder.embed_images([image]), dtype=np.float32)

    def allowed_ids(
        self, filters: str | Sequence[str] | None, max_conditions: int | None = None
    ) -> np.ndarray | None:
        """Ids meeting every filter (nearsight/index/search/filters.py; several in one text
        separated by ';' or new lines), or None for no filter."""
        return allowed_ids(self.gallery, filters, max_conditions)

    def search_vector(
        self,
        vector: np.ndarray,
        k: int,
        exclude_id: int | None = None,
        allowed: np.ndarray | None = None,
        rerank: RerankSpec | None = None,
    ) -> list[Neighbour]:
        """The k nearest items of one query vector, nearest first; ``exclude_id``: leave that
        item out (a gallery item querying the others, and of its re-ranking's expansions);
        ``allowed``: search only these ids (inside FAISS: the true top-k of them);
        ``rerank``: a re-ranking (default :attr:`rerank`; ``NONE`` for off)."""
        spec = self.rerank if rerank is None else rerank
        query = np.asarray(vector, np.float32).reshape(1, -1)
        exclude = None if exclude_id is None else [exclude_id]
        with _one_openmp_thread():
            distances, ids = self.gallery.search(
                query, k, ids=allowed, rerank=spec, exclude=exclude
            )
        found = [
            (int(i), float(d)) for i, d in zip(ids[0], distances[0], strict=True) if i >= 0
        ]
        result = []
        for rank, (item_id, distance) in enumerate(found, start=1):
            row = self.rows[item_id]
            result.append(
                Neighbour(
                    rank=rank,
                    id=item_id,
                    path=self.public_path(row["path"]),
                    label=None if row["label"] is None else int(row["label"]),
                    class_name=row["class_name"],
                    distance=distance if math.isfinite(distance) else None,
                    meta=row.get("meta") or {},
                )
            )
        return result

    def search_image(
        self,
        image: Image.Image,
        k: int,
        allowed: np.ndarray | None = None,
        rerank: RerankSpec | None = None,
    ) -> list[Neighbour]:
        return self.search_vector(self.embed(image), k, allowed=allowed, rerank=rerank)

    def item_vector(self, item_id: int) -> np.ndarray:
        self.row(item_id)  # one-line error for an unknown id
        return self.gallery.vectors_of([int(item_id)])[0]

    def search_item(
        self,
        item_id: int,
        k: int,
        allowed: np.ndarray | None = None,
        rerank: RerankSpec | None = None,
    ) -> list[Neighbour]:
        """Leave-one-out neighbours of a gallery item, from its stored embedding."""
        vector = self.item_vector(item_id)
        return self.search_vector(
            vector, k, exclude_id=int(item_id), allowed=allowed, rerank=rerank
        )

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

    def close(self) -> None:
        self.gallery.close()


@contextlib.contextmanager
def _one_openmp_thread():
    """Search one query on one OpenMP thread. OpenMP's thread count is a per-thread setting, so
    this affects the calling thread only, and it is restored after (torch's embedding uses
    OpenMP too). On a busy machine an OpenMP team spends far longer waiting for its members
    than one query takes (docs/decisions.md), and the page's requests run side by side anyway.
    The background analysis keeps every core for its batched searches."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def class_names(rows) -> dict[int, str]:
    """label -> class name (the first name seen for a label; 'class L' when none is stored)."""
    names: dict[int, str] = {}
    for row in rows:
        label = row.get("label")
        if label is None:
            continue
        name = row.get("class_name")
        if int(label) not in names or (name and names[int(label)].startswith("class ")):
            names[int(label)] = str(name) if name else f"class {label}"
    return dict(sorted(names.items()))


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

    embedders: dict[tuple[Path, str], Any] = {}
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
