"""A gallery opened for serving (the page and the REST API): a :class:`Searcher` with its
model loaded, its catalog rows in memory, and item paths that never show the server's folders.

How a served item is named (``path`` in every answer and error): its path relative to the
gallery's root (the folder fixed when the gallery was made: the dataset's root, or the folder
holding every item), or, for an item from elsewhere (an ``index add`` from another folder), its
file name. No name depends on the other items. ``serve --show-paths`` shows full paths.
The page's view (nearsight/app/page/view.py) adds thumbnails and the failure analysis.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypedDict, TypeVar, Unpack

import faiss
import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.list_columns import listed_row
from nearsight.index.gallery.core import Gallery
from nearsight.models.embedder import Embedder
from nearsight.search.neighbour import Neighbour
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.route import item_row
from nearsight.search.searcher import Searcher


class OneQuery(TypedDict, total=False):
    """How a server asks for one query's neighbours, the request checked already
    (:meth:`ServedGallery.search_one`; the page's grid, nearsight/app/page/products.py)."""

    allowed: np.ndarray | None  # the ids a filter allows (None: every item)
    rerank: RerankSpec | None  # None: the gallery's default re-ranking
    self_id: int | None  # a query that is a gallery item: it comes first, at 0
    exclude_id: int | None  # left out: the page's leave-one-out
    notes: list[str] | None  # collects what the route says of the answer
    query_side: np.ndarray | None  # a query image's stage features [1, F]


class ServedGallery(Searcher):
    """One gallery as a server holds it: catalog rows in memory, the embedder loaded. Safe to
    use from several threads."""

    name: str  # the server's name for it (the dropdown's, REST's ``gallery``)

    def __init__(self, name: str, gallery: Gallery, embedder: Embedder):
        super().__init__(gallery, embedder)
        self.name = name
        self.generation = 0  # counts the reloads of a live gallery (nearsight/app/serve/live.py)
        self.show_paths = False  # serve --show-paths
        self.card_fields: list[str] | None = None  # serve --card-fields (None: the gallery's)
        self._rows: dict[int, dict[str, Any]] = {int(r["id"]): r for r in gallery.all_items()}
        self.ids = np.asarray(gallery.ids, dtype=np.int64)
        self.labels = np.asarray(gallery.labels, dtype=np.int64)
        self.class_names = class_names(self._rows.values())
        self.by_sha256: dict[str, int] = {}
        for item_id, row in sorted(self._rows.items()):
            if row.get("sha256"):
                self.by_sha256.setdefault(str(row["sha256"]), item_id)
        root = gallery.meta.get("root")
        self._root = str(root) if root else None

    def reopened(self) -> Self:
        """A new served gallery of the same kind over this one's folder as it is on disk now,
        with the same embedder (which must still be the gallery's model), the same serving
        settings and the next generation number (a live reload)."""
        gallery = Gallery.open(self.gallery.path)
        try:
            gallery.check_model(self.embedder)
        except BaseException:
            gallery.close()
            raise
        fresh = self._same_kind(gallery)
        fresh.generation = self.generation + 1
        fresh.show_paths = self.show_paths
        fresh.rerank_override = self.rerank_override
        fresh.card_fields = self.card_fields
        return fresh

    def _same_kind(self, gallery: Gallery) -> Self:
        return type(self)(self.name, gallery, self.embedder)

    # -- facts -------------------------------------------------------------------------------

    def shown_fields(self) -> list[str]:
        """The metadata fields a result card leads with, in order: ``serve --card-fields``,
        else the gallery's key column."""
        if self.card_fields:
            return list(self.card_fields)
        return [self.key_column] if self.key_column else []

    def check_card_fields(self) -> None:
        """A one-line error when ``card_fields`` names a column the gallery lacks."""
        known = set(self.gallery.meta_keys())
        unknown = [field for field in self.card_fields or [] if field not in known]
        if unknown:
            columns = ", ".join(sorted(known)) or "none"
            raise NearsightError(
                f"--card-fields: gallery {self.name} has no column {unknown[0]!r} "
                f"(its columns: {columns})"
            )

    def rows(self) -> Mapping[int, dict[str, Any]]:
        return self._rows

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
            return self._rows[int(item_id)]
        except (KeyError, ValueError, TypeError):
            raise NearsightError(f"gallery {self.name} has no item with id {item_id}") from None

    def shown_path(self, row: Mapping[str, Any]) -> str:
        """An item's path as clients see it (module docstring)."""
        text = str(row["path"])
        if self.show_paths:
            return text
        if self._root and os.path.isabs(text):
            relative = os.path.relpath(text, self._root)
            if not relative.startswith(os.pardir):
                return relative
        return os.path.basename(text) or f"item {row['id']}"

    def item_json(self, item_id: int) -> dict[str, Any]:
        """The item as REST gives it (``GET /api/items/{id}``): its catalog row with
        :meth:`shown_path`, a tag column's value as its list of tags, and its key."""
        row = self.row(item_id)
        answer = listed_row(item_row(row, self.shown_path(row)), self.gallery.meta)
        return answer | {"key": self.key_of(item_id)}

    def key_of(self, item_id: int) -> str | None:
        """The item's key, None when the gallery has no key column."""
        column = self.key_column
        value = self.row(item_id)["meta"].get(column) if column else None
        return None if value is None else str(value)

    def identical_item(self, sha256: str) -> int | None:
        """The id of a gallery item whose file has these bytes (by sha256), if any."""
        return self.by_sha256.get(sha256)

    # -- searching (one query on one OpenMP thread: a server's requests run side by side) ----

    def search_vectors(self, vectors: np.ndarray, k: int, **route: Any) -> list[list[Neighbour]]:
        with one_openmp_thread():
            return super().search_vectors(vectors, k, **route)

    def search_page(self, vectors: np.ndarray, k: int, page: Any, **route: Any) -> Any:
        with one_openmp_thread():
            return super().search_page(vectors, k, page, **route)

    def search_one(self, vector: np.ndarray, k: int, **query: Unpack[OneQuery]) -> list[Neighbour]:
        """The k nearest items of one unit query vector, for a request checked already
        (:class:`OneQuery`; ``query_side`` from :meth:`query_embedding`)."""
        vectors = np.asarray(vector, np.float32).reshape(1, -1)
        (found,) = self.search_vectors(vectors, k, **self.route_of(query))
        return found

    def route_of(self, query: OneQuery) -> dict[str, Any]:
        """``query`` as the search route's keywords (:meth:`search_vectors`)."""
        rerank, self_id, exclude_id = (
            query.get("rerank"),
            query.get("self_id"),
            query.get("exclude_id"),
        )
        return {
            "allowed": query.get("allowed"),
            "rerank": self.rerank if rerank is None else rerank,
            "self_ids": None if self_id is None else [self_id],
            "exclude": None if exclude_id is None else [exclude_id],
            "notes": query.get("notes"),
            "query_side": query.get("query_side"),
        }

    def check_item(self, item_id: int) -> None:
        self.row(item_id)  # one-line error for an unknown id

    def item_vector(self, item_id: int) -> np.ndarray:
        self.row(item_id)  # one-line error for an unknown id
        return self.gallery.vectors_of([int(item_id)])[0]


@contextlib.contextmanager
def one_openmp_thread():
    """Search one query on one OpenMP thread. OpenMP's thread count is a per-thread setting, so
    this affects the calling thread only, and it is restored after (torch's embedding uses
    OpenMP too). On a busy machine an OpenMP team spends far longer waiting for its members
    than one query takes (docs/decisions.md), and a server's requests run side by side anyway.
    The page's background analysis keeps every core for its batched searches."""
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

Served = TypeVar("Served", bound=ServedGallery)


def open_served(
    gallery_dirs: Sequence[str | os.PathLike[str]],
    model: str | os.PathLike[str] | None = None,
    device: str = "auto",
    *,
    kind: type[Served],
) -> list[Served]:
    """Open every gallery with the model that embeds its uploads: ``model`` (which must match
    all of them) or the model path each gallery's meta records. One embedder per model file.
    ``kind``: the class to open them as (the page's view adds to this one). Raises
    NearsightError (one line) for a missing/damaged gallery or a model that does not match."""
    from nearsight.index.gallery.model import foreign_spec
    from nearsight.models.loading import load_embedder

    embedders: dict[tuple[Path, str], Embedder] = {}
    served: list[Served] = []
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
            served.append(kind(name, gallery, embedders[key]))
    except BaseException:
        for one in served:
            one.close()
        raise
    return served


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
