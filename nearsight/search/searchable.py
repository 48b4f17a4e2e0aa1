"""A gallery with the model that embeds its queries: what ``nearsight.open_gallery`` returns and
what ``nearsight search`` and ``nearsight eval`` run on.

The model is loaded on the first search (evaluation reads the stored embeddings and needs none),
and checked to be the one the gallery was built with.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from nearsight.core.errors import NearsightError
from nearsight.data.images import load_image
from nearsight.index.gallery.core import Gallery
from nearsight.search.checks import check_k
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.results import ResultsList, SearchResults, as_results
from nearsight.search.route import check_vector, item_vector, resolve_rerank, search_rows

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.index.gallery.build import BuildReport
    from nearsight.models.embedder import Embedder

ImageLike = str | os.PathLike[str] | Image.Image | np.ndarray
Filters = str | Sequence[str] | None
Rerank = RerankSpec | str | None
SEARCH_BATCH = 64  # search_many: images decoded, embedded and searched at a time


class SearchableGallery:
    """An open gallery folder and (on first use) its embedder.

    ``len(g)`` is the number of items; :meth:`search` gives the nearest items of an image as
    dicts; :meth:`evaluate` the papers' leave-one-out metrics. Close it (or use ``with``)."""

    # what built it, when nearsight.build_gallery did
    build_report: BuildReport | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        model: str | os.PathLike[str] | None = None,
        *,
        device: str = "auto",
        optimization: str = "all",
    ) -> None:
        self.gallery = Gallery.open(path)
        self.path = self.gallery.path
        self._model_override = model
        self._device = device
        self._optimization = optimization
        self._embedder: Embedder | None = None

    @property
    def embedder(self) -> Embedder:
        """The embedder of the gallery's queries (its recorded model, or ``model``), loaded and
        checked against the gallery on first use."""
        if self._embedder is None:
            self._embedder = self.gallery.load_model(
                self._model_override, device=self._device, optimization=self._optimization
            )
        return self._embedder

    def __len__(self) -> int:
        return len(self.gallery)

    def search(
        self,
        image: ImageLike,
        k: int = 8,
        *,
        filters: Filters = None,
        label: int | None = None,
        rerank: Rerank = None,
    ) -> SearchResults:
        """The ``k`` nearest gallery items of ``image`` (a file path, a PIL image, or an array
        H x W x 3 / H x W of uint8, or of floats in [0, 1]), nearest first: dicts with rank, id,
        path, label, class_name, distance (Euclidean between unit vectors, 0 to 2) and meta
        (the item's extra columns). ``filters``: search only items matching all of them
        (``"shop=north"``, ``["price>=10", "price<20"]``; inside FAISS, so k items come back
        whenever k match). ``label``: the query's class, if known (colours the HTML grid,
        adds a ``correct`` column to ``to_pandas()``). ``rerank``: re-rank the candidates
        (``"aqe:k=2,alpha=3"``, nearsight.search.rerank; ``"none"`` for off); default: the
        gallery's stored choice. An unreadable image raises NearsightError; several images go
        to :meth:`search_many`."""
        if isinstance(image, list | tuple) or (isinstance(image, np.ndarray) and image.ndim == 4):
            raise NearsightError(
                "search takes one image; for several, use search_many(images) (one result "
                "per image, an unreadable one reported in its entry instead of stopping)"
            )
        k = check_k(k)
        decoded = as_image(image, self.embedder.resize)
        vectors = self.embedder.embed_images([decoded])
        return self._results(vectors, k, filters, rerank, [image], [label])[0]

    def search_many(
        self,
        images: Iterable[ImageLike] | np.ndarray,
        k: int = 8,
        *,
        filters: Filters = None,
        labels: Sequence[int | None] | None = None,
        batch_size: int = SEARCH_BATCH,
        rerank: Rerank = None,
    ) -> ResultsList:
        """:meth:`search` of many images (an iterable, or an array N x H x W x 3), embedded
        ``batch_size`` at a time (memory stays bounded however many there are). One entry per
        image, in order; an image that cannot be read gives an empty entry whose ``.error``
        says why, and the others go on (``.errors`` lists them). ``labels``: each query's
        class, if known. ``to_pandas()`` gives one table of all of them."""
        k = check_k(k)
        if isinstance(images, str | os.PathLike | Image.Image):
            raise NearsightError("search_many takes a list of images; for one, use search")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise NearsightError(
                f"batch_size must be a whole number of at least 1, got {batch_size!r}"
            )
        rerank = resolve_rerank(self.gallery, rerank)  # a bad spec fails before any image
        queries = list(images)
        wanted = [None] * len(queries) if labels is None else list(labels)
        if len(wanted) != len(queries):
            raise NearsightError(f"{len(wanted)} labels for {len(queries)} images")
        results = ResultsList()
        for start in range(0, len(queries), batch_size):
            chunk = queries[start : start + batch_size]
            entries: list[SearchResults | None] = [None] * len(chunk)
            decoded, positions = [], []
            for position, image in enumerate(chunk):
                try:
                    decoded.append(as_image(image, self.embedder.resize))
                    positions.append(position)
                except NearsightError as error:  # this image only: the others go on
                    entries[position] = SearchResults(query=image, error=str(error))
            if decoded:
                vectors = self.embedder.embed_images(decoded)
                found = self._results(
                    vectors,
                    k,
                    filters,
                    rerank,
                    [chunk[p] for p in positions],
                    [wanted[start + p] for p in positions],
                )
                for position, answer in zip(positions, found, strict=True):
                    entries[position] = answer
            results.extend(entries)
        return results

    def search_vector(
        self,
        vector: Any,
        k: int = 8,
        *,
        filters: Filters = None,
        label: int | None = None,
        rerank: Rerank = None,
    ) -> SearchResults:
        """:meth:`search` by an embedding of the gallery's dim (made unit length here), e.g.
        one from :meth:`vector`, from :func:`load_embedder` or from another system that uses
        the same model."""
        vectors = check_vector(self.gallery, vector)[:1]
        return self._results(vectors, check_k(k), filters, rerank, [vector], [label])[0]

    def search_item(
        self, item_id: int, k: int = 8, *, filters: Filters = None, rerank: Rerank = None
    ) -> SearchResults:
        """:meth:`search` by a gallery item's stored embedding (the item itself comes first,
        at distance 0, unless a filter leaves it out); the item's class is the query's."""
        vector = item_vector(self.gallery, int(item_id))
        (row,) = self.gallery.items([int(item_id)])
        label = row.get("label")
        return self._results(vector, check_k(k), filters, rerank, [int(item_id)], [label])[0]

    def vector(self, item_id: int) -> np.ndarray:
        """The stored embedding of gallery item ``item_id``: float32 [dim], unit length (a
        one-line error when the gallery has no such item)."""
        return np.array(item_vector(self.gallery, int(item_id))[0], dtype=np.float32)

    def _results(
        self,
        vectors: np.ndarray,
        k: int,
        filters: Filters,
        rerank: Rerank,
        queries: Sequence[Any],
        labels: Sequence[int | None],
    ) -> list[SearchResults]:
        answers = search_rows(self.gallery, vectors, k, filters=filters, rerank=rerank)
        return as_results(answers, queries, labels)

    def evaluate(
        self, ks: Sequence[int] | None = None, queries: int | None = None, rerank: Rerank = None
    ) -> dict[str, float | int]:
        """Recall@k, NMI and MAP@R of the stored embeddings (every labelled item queries the
        other labelled items); ``ks``: default the papers' values for the gallery's dataset.
        ``queries``: only a seeded sample of that many labelled items query (each still
        searching all the others exactly), see nearsight.data.metrics.retrieval.evaluate. ``rerank``: as in
        :meth:`search` (leave-one-out: no query reaches itself through an expansion)."""
        spec = resolve_rerank(self.gallery, rerank)
        return evaluate_gallery(self.gallery, ks, queries, spec)

    def close(self) -> None:
        self.gallery.close()

    def __enter__(self) -> SearchableGallery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SearchableGallery({str(self.path)!r}, items={len(self)})"


def as_image(image: ImageLike, min_side: int | None = None) -> Image.Image:
    """A query as an RGB PIL image; paths are read by :func:`nearsight.data.images.load_image` (one-line
    errors for missing or unreadable files)."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        array = image
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
            raise NearsightError(
                f"an image array must be H x W, H x W x 3 or H x W x 4, got shape {list(image.shape)}"
            )
        if array.dtype != np.uint8:
            if not np.issubdtype(array.dtype, np.floating):
                raise NearsightError(f"an image array must be uint8 or float, got {array.dtype}")
            array = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        return Image.fromarray(np.ascontiguousarray(array)).convert("RGB")
    if isinstance(image, str | os.PathLike):
        return load_image(Path(image), min_side)
    raise NearsightError(
        f"a query image is a file path, a PIL image or a numpy array, not {type(image).__name__}"
    )


def open_gallery(
    path: str | os.PathLike[str],
    model: str | os.PathLike[str] | None = None,
    *,
    device: str = "auto",
    optimization: str = "all",
) -> SearchableGallery:
    """Open the gallery folder ``path`` for searching. ``model``: the model that embeds queries
    (default: the one the gallery records; it must be the model that built it). ``device``:
    auto | cpu | cuda. ``optimization``: onnxruntime's graph optimisation, ``all`` (fastest per
    query) or ``extended`` (half the load time and memory, for a few queries)."""
    return SearchableGallery(path, model, device=device, optimization=optimization)
