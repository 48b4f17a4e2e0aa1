"""A gallery opened for serving (the page and the REST API): its model, its catalog rows in
memory, the paths clients may see, and searches through :func:`nearsight.search.route.
search_rows` (the one search route) answered as :class:`Neighbour` (the one row shape, typed).
The page's view (nearsight/app/page_view.py) adds thumbnails and the failure analysis."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import faiss
import numpy as np
from PIL import Image

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.core import Gallery
from nearsight.models.embedder import Embedder
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.route import allowed_ids, search_rows, stored_rerank


@dataclass(frozen=True)
class Neighbour:
    """One row of :func:`~nearsight.search.route.search_rows` (the one shape) and its
    rank, with the row's fields as attributes."""

    rank: int
    row: dict[str, Any]

    id = property(lambda self: int(self.row["id"]))
    path = property(lambda self: str(self.row["path"]))
    label = property(lambda self: None if self.row["label"] is None else int(self.row["label"]))
    class_name = property(lambda self: self.row["class_name"])
    # None where an approximate index found fewer than k
    distance = property(lambda self: self.row["distance"])
    meta = property(lambda self: self.row["meta"])  # the item's extra columns

    def as_json(self) -> dict[str, Any]:
        """The row: the shape `nearsight search --json` prints."""
        return {**self.row, "meta": dict(self.row["meta"])}


class ServedGallery:
    """One gallery as a server holds it: catalog rows in memory, the embedder. Safe to use
    from several threads."""

    def __init__(self, name: str, gallery: Gallery, embedder: Embedder):
        self.name = name
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

    # -- facts -------------------------------------------------------------------------------

    @property
    def rerank(self) -> RerankSpec:
        """The re-ranking searches use unless told otherwise: serve --rerank, else the
        gallery's stored choice (nearsight eval --tune-on ... --save), else none."""
        if self.rerank_override is not None:
            return self.rerank_override
        return stored_rerank(self.gallery)

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
        """Ids meeting every filter (nearsight/index/catalog/filters.py; several in one text
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
        query = np.asarray(vector, np.float32).reshape(1, -1)
        exclude = None if exclude_id is None else [exclude_id]
        with one_openmp_thread():
            (found,) = search_rows(self.gallery, query, k, allowed=allowed, exclude=exclude,
                                   rerank=self.rerank if rerank is None else rerank,
                                   rows=self.rows)  # fmt: skip
        return [
            Neighbour(rank, {**row, "path": self.public_path(row["path"])})
            for rank, row in enumerate(found, start=1)
        ]

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

    def close(self) -> None:
        self.gallery.close()


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
    kind: type[Served] = ServedGallery,  # type: ignore[assignment]
) -> list[Served]:
    """Open every gallery with the model that embeds its uploads: ``model`` (which must match
    all of them) or the model path each gallery's meta records. One embedder per model file.
    ``kind``: the class to open them as (the page's view adds to this one). Raises
    NearsightError (one line) for a missing/damaged gallery or a model that does not match."""
    from nearsight.index.gallery.model import foreign_spec
    from nearsight.models.embedder import load_embedder

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
