"""The :class:`Searcher`: a gallery and the embedder of its queries, the one object that the CLI,
REST, the page and the Python API (``nearsight.open_gallery``) search through.

Its public methods take a caller's input, check it once (``k``, the filters, the re-rank spec,
the query) and call the one route, :func:`nearsight.search.route.search`; their answers are
:class:`~nearsight.search.neighbour.Neighbour` lists (``SearchResults``).

``search_item`` means one thing everywhere: the item itself comes first, at distance 0 (unless
a filter leaves it out). ``leave_out=True`` asks for the other items only (the page's
leave-one-out, as the evaluation does). A query image whose file has the same bytes as a gallery
item is searched as that item: it comes first, at distance 0.

The model is loaded on the first image search (evaluation and searches by vector or id need
none) and checked to be the one the gallery was built with.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.image_input import ImageLike, QueryImage, read_query
from nearsight.index.catalog.facets import BINS, TOP_VALUES, Facets
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.keys import ids_of_keys, key_column
from nearsight.search import route
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.facets import gallery_facets
from nearsight.search.groups import Group, default_group_column, search_groups
from nearsight.search.labels import query_label
from nearsight.search.neighbour import Neighbour
from nearsight.search.paging import FIRST_PAGE, Page, check_page
from nearsight.search.query_embed import embed_queries
from nearsight.search.rerank.spec import NONE, RerankSpec
from nearsight.search.results import ResultsList, SearchResults

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.index.gallery.build import BuildReport
    from nearsight.models.embedder import Embedder

Filters = route.Filters
Filtered = route.Filtered
Rerank = RerankSpec | str | None
SEARCH_BATCH = 64  # search_many: images decoded, embedded and searched at a time


class Searcher:
    """An open gallery and (given, or loaded on first use) its embedder.

    ``len(s)`` is the number of items; :meth:`search` gives the nearest items of an image;
    :meth:`evaluate` the papers' leave-one-out metrics. Close it (or use ``with``). Safe to
    search from several threads."""

    # what built it, when nearsight.build_gallery did
    build_report: BuildReport | None = None

    def __init__(
        self,
        gallery: Gallery,
        embedder: Embedder | None = None,
        *,
        model: str | os.PathLike[str] | None = None,
        device: str = "auto",
        optimization: str = "all",
    ) -> None:
        self.gallery = gallery
        self.path = gallery.path
        self._rerank_override: RerankSpec | None = None  # serve --rerank
        self._embedder = embedder
        self._model_override = model
        self._device = device
        self._optimization = optimization

    # -- facts -------------------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The embedder of the gallery's queries (its recorded model, or ``model``), loaded and
        checked against the gallery on first use."""
        if self._embedder is None:
            self._embedder = self.gallery.load_model(
                self._model_override, device=self._device, optimization=self._optimization
            )
        return self._embedder

    @property
    def rerank_override(self) -> RerankSpec | None:
        """The re-ranking that overrides the gallery's stored one (serve --rerank), if any."""
        return self._rerank_override

    @rerank_override.setter
    def rerank_override(self, spec: RerankSpec | None) -> None:
        if spec is not None:  # refused when set (serve's start), not on the first search
            route.check_rerank(self.gallery, spec)
        self._rerank_override = spec

    @property
    def rerank(self) -> RerankSpec:
        """The re-ranking searches use unless told otherwise: serve --rerank, else the
        gallery's stored choice (nearsight eval --tune-on ... --save), else none."""
        if self.rerank_override is not None:
            return self.rerank_override
        return route.stored_rerank(self.gallery)

    def __len__(self) -> int:
        return len(self.gallery)

    def shown_path(self, row: Mapping[str, Any]) -> str:
        """An item's path as this searcher's callers see it (here: as stored)."""
        return str(row["path"])

    def identical_item(self, sha256: str) -> int | None:
        """The id of a gallery item whose file has these bytes (by sha256), if any."""
        return self.gallery.item_with_bytes(sha256)

    def rows(self) -> Mapping[int, dict[str, Any]] | None:
        """The catalog rows by id where they are held in memory (None: read per search)."""
        return None

    # -- checking a request once -------------------------------------------------------------

    def allowed_ids(self, filters: Filters, max_conditions: int | None = None) -> np.ndarray | None:
        """Ids meeting every filter (several in one text separated by ';' or new lines), or
        None for no filter."""
        return route.allowed_ids(self.gallery, filters, max_conditions)

    def filtered(self, filters: Filters, max_conditions: int | None = None) -> Filtered:
        """The filters checked once: the allowed ids, notes on values no item holds (for the
        caller to show), the keys filtered on (:func:`nearsight.search.route.check_filters`)."""
        return route.check_filters(self.gallery, filters, max_conditions)

    def facets(
        self,
        filters: Filters = None,
        *,
        top: int = TOP_VALUES,
        bins: int = BINS,
        max_conditions: int | None = None,
    ) -> Facets:
        """What the items ``filters`` allow hold: each text column's ``top`` most frequent
        values with exact counts, each number or date column's range and a ``bins``-bin
        histogram (nearsight/index/catalog/facets.py). ``.as_dict()`` is REST's answer."""
        found = gallery_facets(self.gallery, filters, top, bins, max_conditions)
        for note in found.notes:
            warnings.warn(note, FilterNote, stacklevel=2)
        return found

    @property
    def key_column(self) -> str | None:
        """The gallery's key column (a shop's SKU), None without one."""
        return key_column(self.gallery)

    @property
    def group_column(self) -> str | None:
        """The column the gallery groups by by default (``--group-column``), None without."""
        return default_group_column(self.gallery)

    def id_of_key(self, key: str) -> int:
        """The id of the item with this key (one-line NearsightError when the gallery has no
        key column or no item with that key)."""
        found = ids_of_keys(self.gallery, [str(key)])
        if str(key) not in found:
            raise NearsightError(f"the gallery has no item with key {str(key)[:200]!r}")
        return found[str(key)]

    def resolve_rerank(self, rerank: Rerank) -> RerankSpec:
        """``rerank`` parsed (a one-line error when bad); None: :attr:`rerank`."""
        if rerank is None:
            return self.rerank
        return route.resolve_rerank(self.gallery, rerank)

    # -- searching ---------------------------------------------------------------------------

    def search(
        self,
        image: ImageLike,
        k: int = 8,
        *,
        filters: Filters = None,
        label: int | str | None = None,
        rerank: Rerank = None,
        offset: int = 0,
        group_by: str | None = None,
        group_size: int = 1,
    ) -> SearchResults:
        """The ``k`` nearest gallery items of ``image`` (a file path, a PIL image, or an array
        H x W x 3 / H x W of uint8, or of floats in [0, 1]), nearest first. ``filters``: search
        only items matching all of them (``"shop=north"``, ``["price>=10", "price<20"]``;
        inside FAISS, so k items come back whenever k match). ``label``: the query's class, if
        known, as a number or a class name (colours the HTML grid, adds a ``correct`` column
        to ``to_pandas()``). ``rerank``: re-rank the candidates (``"aqe:k=2,alpha=3"``,
        nearsight.search.rerank; ``"none"`` for off); default: the gallery's stored choice.
        ``offset``: a page, ranks ``offset + 1`` to ``offset + k`` of the search of
        ``offset + k``. ``group_by``: a column (a SKU): at most ``k`` groups of items holding
        one value, ordered by their best distance, each with its best ``group_size`` items
        (``.groups``; the results list their hits in that order; nearsight.search.groups).
        An unreadable image raises NearsightError; several images go to :meth:`search_many`."""
        if isinstance(image, list | tuple) or (isinstance(image, np.ndarray) and image.ndim == 4):
            raise NearsightError(
                "search takes one image; for several, use search_many(images) (one result "
                "per image, an unreadable one reported in its entry instead of stopping)"
            )
        k, allowed, spec = self._request(k, filters, rerank)
        page = check_page(self.gallery, offset, group_by, group_size)
        wanted = query_label(self.gallery, label)
        decoded = self._read(image)
        notes: list[str] = []
        (found,) = self._search_images([decoded], k, allowed, spec, notes, page)
        return self._results(found, page, query=image, label=wanted, notes=notes)

    def search_many(
        self,
        images: Iterable[ImageLike] | np.ndarray,
        k: int = 8,
        *,
        filters: Filters = None,
        labels: Sequence[int | str | None] | None = None,
        batch_size: int = SEARCH_BATCH,
        rerank: Rerank = None,
        offset: int = 0,
        group_by: str | None = None,
        group_size: int = 1,
    ) -> ResultsList:
        """:meth:`search` of many images (an iterable, or an array N x H x W x 3), embedded
        ``batch_size`` at a time (memory stays bounded however many there are). One entry per
        image, in order; an image that cannot be read gives an empty entry whose ``.error``
        says why, and the others go on (``.errors`` lists them). ``labels``: each query's
        class, if known. ``offset``, ``group_by``, ``group_size``: as in :meth:`search`.
        ``to_pandas()`` gives one table of all of them."""
        if isinstance(images, str | os.PathLike) or not isinstance(images, Iterable):
            raise NearsightError("search_many takes a list of images; for one, use search")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise NearsightError(
                f"batch_size must be a whole number of at least 1, got {batch_size!r}"
            )
        k, allowed, spec = self._request(k, filters, rerank)  # bad input fails before any image
        page = check_page(self.gallery, offset, group_by, group_size)
        queries = list(images)
        given = [None] * len(queries) if labels is None else list(labels)
        if len(given) != len(queries):
            raise NearsightError(f"{len(given)} labels for {len(queries)} images")
        wanted = [query_label(self.gallery, label) for label in given]
        results = ResultsList()
        for start in range(0, len(queries), batch_size):
            chunk = queries[start : start + batch_size]
            entries: list[SearchResults | None] = [None] * len(chunk)
            decoded, positions = [], []
            for position, image in enumerate(chunk):
                try:
                    decoded.append(self._read(image))
                    positions.append(position)
                except NearsightError as error:  # this image only: the others go on
                    entries[position] = SearchResults(query=image, error=str(error))
            notes: list[str] = []
            found: list[list[Neighbour]] | list[list[Group]] = (
                self._search_images(decoded, k, allowed, spec, notes, page) if decoded else []
            )
            for index, position in enumerate(positions):
                neighbours = found[index]
                label = wanted[start + position]
                entries[position] = self._results(neighbours, page, query=chunk[position],
                                                  label=label, notes=notes)  # fmt: skip
            results.extend(entries)
        return results

    def search_vector(
        self,
        vector: Any,
        k: int = 8,
        *,
        filters: Filters = None,
        label: int | str | None = None,
        rerank: Rerank = None,
        offset: int = 0,
        group_by: str | None = None,
        group_size: int = 1,
    ) -> SearchResults:
        """:meth:`search` by an embedding of the gallery's dim (made unit length here), e.g.
        one from :meth:`vector`, from :func:`load_embedder` or from another system that uses
        the same model."""
        k, allowed, spec = self._request(k, filters, rerank)
        page = check_page(self.gallery, offset, group_by, group_size)
        wanted = query_label(self.gallery, label)
        vectors = route.check_vector(self.gallery, vector)[:1]
        notes: list[str] = []
        (found,) = self.search_page(vectors, k, page, allowed=allowed, rerank=spec, notes=notes)
        return self._results(found, page, query=vector, label=wanted, notes=notes)

    def search_item(
        self,
        item_id: int | None = None,
        k: int = 8,
        *,
        key: str | None = None,
        filters: Filters = None,
        rerank: Rerank = None,
        leave_out: bool = False,
        offset: int = 0,
        group_by: str | None = None,
        group_size: int = 1,
    ) -> SearchResults:
        """:meth:`search` by a gallery item's stored embedding, the item named by its id or
        by its ``key`` (the gallery's key column, e.g. a SKU): the item itself comes first, at
        distance 0 (unless a filter leaves it out); ``leave_out``: the other items only. The
        item's class is the query's."""
        if (item_id is None) == (key is None):
            raise NearsightError("search_item takes an item id or a key=, not both")
        item = self.id_of_key(key) if key is not None else route.check_item_id(item_id)
        k, allowed, spec = self._request(k, filters, rerank)
        page = check_page(self.gallery, offset, group_by, group_size)
        vector = self.item_vector(item)
        notes: list[str] = []
        found = self.search_page(vector[None, :], k, page, allowed=allowed, rerank=spec,
                                 notes=notes, **_as_item(item, leave_out))  # fmt: skip
        label = self.gallery.items([item])[0]["label"]
        return self._results(found[0], page, query=item, label=label, notes=notes)

    def _class_name(self, label: int | None) -> str | None:
        return None if label is None else self.gallery.class_names().get(int(label))

    def _results(
        self, found: list[Neighbour] | list[Group], page: Page, *, query: Any,
        label: int | None, notes: list[str],
    ) -> SearchResults:  # fmt: skip
        """One query's answer: its neighbours, or its groups and their hits in order."""
        groups = None if page.group_by is None else [g for g in found if isinstance(g, Group)]
        # without group_by the route answers neighbours
        hits = (
            cast(list[Neighbour], found)
            if groups is None
            else [hit for g in groups for hit in g.neighbours]
        )
        return SearchResults(hits, query=query, query_label=label, notes=notes, groups=groups,
                             query_class=self._class_name(label))  # fmt: skip

    def search_vectors(
        self,
        vectors: np.ndarray,
        k: int,
        *,
        allowed: np.ndarray | None = None,
        rerank: RerankSpec,
        self_ids: Sequence[int | None] | None = None,
        exclude: Sequence[int] | np.ndarray | None = None,
        notes: list[str] | None = None,
        query_side: np.ndarray | None = None,
        offset: int = 0,
    ) -> list[list[Neighbour]]:
        """The route itself, for callers that checked their request already (REST, the page,
        the CLI's batch): unit query vectors [Q, D], a checked ``k``, the allowed ids, a
        parsed spec; ``self_ids`` / ``exclude`` / ``query_side`` / ``offset`` as in
        :func:`nearsight.search.route.search`."""
        return route.search(
            self.gallery,
            vectors,
            k,
            allowed=allowed,
            rerank=rerank,
            self_ids=self_ids,
            exclude=exclude,
            query_side=query_side,
            rows=self.rows(),
            shown_path=self.shown_path,
            notes=notes,
            offset=offset,
        )

    def search_page(
        self, vectors: np.ndarray, k: int, page: Page, **route_args: Any
    ) -> list[list[Neighbour]] | list[list[Group]]:
        """:meth:`search_vectors` of a checked ``page`` (:func:`check_page`): its offset, and
        groups (nearsight.search.groups) when it groups."""
        if page.group_by is None:
            return self.search_vectors(vectors, k, offset=page.offset, **route_args)
        return search_groups(self.gallery, vectors, k, group_by=page.group_by,
                             group_size=page.group_size, offset=page.offset, rows=self.rows(),
                             shown_path=self.shown_path, **route_args)  # fmt: skip

    def item_vector(self, item_id: int) -> np.ndarray:
        """The stored embedding of gallery item ``item_id``: float32 [dim], unit length (a
        one-line error when the gallery has no such item)."""
        return route.item_vector(self.gallery, int(item_id))[0]

    def vector(self, item_id: int) -> np.ndarray:
        """:meth:`item_vector`, as a copy the caller may change."""
        return np.array(self.item_vector(item_id), dtype=np.float32)

    def _request(
        self, k: Any, filters: Filters, rerank: Rerank
    ) -> tuple[int, np.ndarray | None, RerankSpec]:
        """A Python caller's request, checked once: k, the allowed ids, the re-rank spec; a
        filter value no item holds is a warning naming the closest values held."""
        k = route.check_k(k)
        filtered = self.filtered(filters)
        for note in filtered.notes:
            warnings.warn(note, FilterNote, stacklevel=3)
        return k, filtered.allowed, self.resolve_rerank(rerank)

    def _read(self, image: ImageLike) -> QueryImage:
        """A query decoded (a file in the decode box) at the model's resize."""
        return read_query(image, self.embedder.resize, self.embedder.spec.interpolation)

    def query_vector(self, query: QueryImage) -> tuple[np.ndarray, int | None]:
        """One query image's vector, and the gallery item it is when its bytes are an item's
        file (then that item's stored vector: it is searched as that item)."""
        vector, twin, _ = self.query_embedding(query, NONE)
        return vector, twin

    def query_embedding(
        self, query: QueryImage, rerank: RerankSpec
    ) -> tuple[np.ndarray, int | None, np.ndarray | None]:
        """:meth:`query_vector`, and the query's stage features [1, F] when ``rerank`` is a
        pairwise re-ranker that takes them (else None): then the vector and the features
        come from one run of the gallery's stage model (:meth:`stage_model`)."""
        vectors, twins, side = embed_queries(self, [query], rerank)
        return vectors[0], twins[0], side

    def stage_model(self, rerank: RerankSpec):
        """The gallery's stage model (nearsight.search.rerank.stage_query.StageEmbedder) when
        ``rerank`` scores query images by a trunk stage's features too, else None; on the
        embedder's providers. A one-line NearsightError when the gallery cannot give them."""
        if rerank.method != "pairwise":
            return None
        from nearsight.search.rerank.stage_query import stage_query_model

        return stage_query_model(self.gallery, rerank, self.embedder, self._optimization)

    def _search_images(
        self,
        decoded: Sequence[QueryImage],
        k: int,
        allowed: np.ndarray | None,
        spec: RerankSpec,
        notes: list[str] | None = None,
        page: Page = FIRST_PAGE,
    ) -> list[list[Neighbour]] | list[list[Group]]:
        """Decoded query images searched: embedded together, one whose bytes are a gallery
        item's searched as that item (nearsight.search.query_embed)."""
        vectors, twins, side = embed_queries(self, decoded, spec)
        return self.search_page(vectors, k, page, allowed=allowed, rerank=spec, self_ids=twins,
                                notes=notes, query_side=side)  # fmt: skip

    # -- evaluating --------------------------------------------------------------------------

    def evaluate(
        self, ks: Sequence[int] | None = None, queries: int | None = None, rerank: Rerank = None
    ) -> dict[str, float | int]:
        """Recall@k, NMI and MAP@R of the stored embeddings (every labelled item queries the
        other labelled items); ``ks``: default the papers' values for the gallery's dataset.
        ``queries``: only a seeded sample of that many labelled items query (each still
        searching all the others exactly), see nearsight.data.metrics.retrieval.evaluate.
        ``rerank``: as in :meth:`search` (leave-one-out: no query reaches itself through an
        expansion)."""
        return evaluate_gallery(self.gallery, ks, queries, self.resolve_rerank(rerank))

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self.gallery.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, items={len(self)})"


class FilterNote(UserWarning):
    """A filter value no item holds (the message names the closest values held)."""


def _as_item(item: int, leave_out: bool) -> dict[str, Any]:
    """The route's arguments for a query that is gallery item ``item``."""
    return {"exclude": [item]} if leave_out else {"self_ids": [item]}


def open_gallery(
    path: str | os.PathLike[str],
    model: str | os.PathLike[str] | None = None,
    *,
    device: str = "auto",
    optimization: str = "all",
) -> Searcher:
    """Open the gallery folder ``path`` for searching. ``model``: the model that embeds queries
    (default: the one the gallery records; it must be the model that built it). ``device``:
    auto | cpu | cuda. ``optimization``: onnxruntime's graph optimisation, ``all`` (fastest per
    query) or ``extended`` (half the load time and memory, for a few queries)."""
    return Searcher(Gallery.open(path), model=model, device=device, optimization=optimization)
