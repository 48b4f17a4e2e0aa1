"""The :class:`Searcher`: a gallery and the embedder of its queries, the one object that the CLI,
REST, the page and the Python API (``nearsight.open_gallery``) search through.

Every face hands it one :class:`~nearsight.search.request.SearchRequest` (the query, ``k``, the
filters, the re-ranking, the page): :meth:`Searcher.run` checks it once
(nearsight.search.request) and answers it through the one route
(nearsight.search.answer, nearsight.search.route); the answers are
:class:`~nearsight.search.neighbour.Neighbour` lists (``SearchResults``) with their notes. The
keyword methods (:meth:`~Searcher.search`, ``search_vector``, ``search_item``, ``search_many``)
are the Python API: each builds that request. A re-ranker is built once per gallery and reused.

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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.image_input import ImageLike, QueryImage, read_query
from nearsight.index.catalog.facets import BINS, TOP_VALUES, Facets
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.keys import ids_of_keys, key_column
from nearsight.search import route
from nearsight.search.answer import answer
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.facets import gallery_facets
from nearsight.search.groups import Group, default_group_column, search_groups
from nearsight.search.keywords import FilterNote, KeywordSearches, Rerank
from nearsight.search.neighbour import Neighbour
from nearsight.search.paging import Page
from nearsight.search.query_embed import embed_queries
from nearsight.search.request import (
    NO_LIMITS,
    CheckedRequest,
    Limits,
    SearchRequest,
    check_request,
)
from nearsight.search.rerank.rerankers import Reranker, Rerankers
from nearsight.search.rerank.spec import NONE, RerankSpec
from nearsight.search.results import SearchResults

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.index.gallery.build import BuildReport
    from nearsight.models.embedder import Embedder
    from nearsight.search.rerank.stage_query import StageEmbedder

Filters = route.Filters
Filtered = route.Filtered
__all__ = ["FilterNote", "Searcher", "open_gallery"]


class Searcher(KeywordSearches):
    """An open gallery and (given, or loaded on first use) its embedder.

    ``len(s)`` is the number of items; :meth:`search` gives the nearest items of an image;
    :meth:`evaluate` the papers' leave-one-out metrics. Close it (or use ``with``). Safe to
    search from several threads."""

    # what built it, when nearsight.build_gallery did
    build_report: BuildReport | None = None
    name: str | None = None  # a server's name for it (a request may name its gallery)

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
        self._rerankers = Rerankers()  # built once per gallery, by spec
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
            self.reranker(spec)
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
        return self.reranker(rerank).spec

    def reranker(self, rerank: Rerank | Reranker) -> Reranker:
        """``rerank`` made ready for this gallery (nearsight.search.rerank.rerankers): built
        on first use, then reused until the gallery changes; None: :attr:`rerank`'s. A
        one-line NearsightError when it is bad or cannot re-rank this gallery."""
        return self._rerankers.get(self.gallery, self.rerank if rerank is None else rerank)

    def label_of(self, item_id: int) -> int | None:
        """The class label of gallery item ``item_id`` (None: unlabelled)."""
        label = self.gallery.items([int(item_id)])[0]["label"]
        return None if label is None else int(label)

    def label_name(self, label: int | None) -> str | None:
        """The class name of ``label``, when the gallery knows it."""
        return None if label is None else self.gallery.class_names().get(int(label))

    # -- the one entry point ------------------------------------------------------------------

    def check(self, request: SearchRequest, limits: Limits = NO_LIMITS) -> CheckedRequest:
        """``request`` checked once against this gallery (nearsight.search.request): a
        one-line NearsightError when a part is bad. ``limits``: what the face allows."""
        return check_request(self, request, limits)

    def run(
        self, request: SearchRequest | CheckedRequest, limits: Limits = NO_LIMITS
    ) -> SearchResults:
        """The answer to one search request (:class:`~nearsight.search.request.SearchRequest`,
        or one :meth:`check` ed already), what every face asks through: its neighbours (or
        groups), with ``notes`` on values no item holds of a filter and on what the route
        could not promise. ``limits``: what the face allows (:meth:`check`)."""
        checked = request if isinstance(request, CheckedRequest) else self.check(request, limits)
        return answer(self, checked)

    # -- the route, for a checked request ----------------------------------------------------

    def search_vectors(
        self,
        vectors: np.ndarray,
        k: int,
        *,
        allowed: np.ndarray | None = None,
        rerank: RerankSpec | Reranker,
        self_ids: Sequence[int | None] | None = None,
        exclude: Sequence[int] | np.ndarray | None = None,
        notes: list[str] | None = None,
        query_side: np.ndarray | None = None,
        offset: int = 0,
    ) -> list[list[Neighbour]]:
        """The route itself (:func:`nearsight.search.route.search`), for a request checked
        already: unit query vectors [Q, D], a checked ``k``, the allowed ids, a re-ranker."""
        return route.search(
            self.gallery,
            vectors,
            k,
            allowed=allowed,
            rerank=self.reranker(rerank),
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
        """:meth:`search_vectors` of a checked ``page`` (nearsight.search.paging): its offset, and
        groups (nearsight.search.groups) when it groups."""
        if page.group_by is None:
            return self.search_vectors(vectors, k, offset=page.offset, **route_args)
        route_args["rerank"] = self.reranker(route_args["rerank"])
        return search_groups(self.gallery, vectors, k, group_by=page.group_by,
                             group_size=page.group_size, offset=page.offset, rows=self.rows(),
                             shown_path=self.shown_path, **route_args)  # fmt: skip

    def item_vector(self, item_id: int) -> np.ndarray:
        """The stored embedding of gallery item ``item_id``: float32 [dim], unit length (a
        one-line error when the gallery has no such item)."""
        return route.item_vector(self.gallery, int(item_id))[0]

    def check_item(self, item_id: int) -> None:
        """A one-line NearsightError when the gallery has no item ``item_id``."""
        self.item_vector(item_id)

    def vector(self, item_id: int) -> np.ndarray:
        """:meth:`item_vector`, as a copy the caller may change."""
        return np.array(self.item_vector(item_id), dtype=np.float32)

    def read_image(self, image: ImageLike | QueryImage) -> QueryImage:
        """A query decoded (a file in the decode box) at the model's resize; one decoded
        already passes through."""
        if isinstance(image, QueryImage):
            return image
        return read_query(image, self.embedder.resize, self.embedder.spec.interpolation)

    _read = read_image

    def query_vector(self, query: QueryImage) -> tuple[np.ndarray, int | None]:
        """One query image's vector, and the gallery item it is when its bytes are an item's
        file (then that item's stored vector: it is searched as that item)."""
        vector, twin, _ = self.query_embedding(query, NONE)
        return vector, twin

    def query_embedding(
        self, query: QueryImage, rerank: RerankSpec | Reranker
    ) -> tuple[np.ndarray, int | None, np.ndarray | None]:
        """:meth:`query_vector`, and the query's stage features [1, F] when ``rerank`` is a
        pairwise re-ranker that takes them (else None): then the vector and the features
        come from one run of the gallery's stage model (:meth:`stage_model`)."""
        vectors, twins, side = embed_queries(self, [query], self.reranker(rerank))
        return vectors[0], twins[0], side

    def stage_model(self, rerank: RerankSpec | Reranker) -> StageEmbedder | None:
        """The gallery's stage model (nearsight.search.rerank.stage_query.StageEmbedder) when
        ``rerank`` scores query images by a trunk stage's features too, else None; on the
        embedder's providers. A one-line NearsightError when the gallery cannot give them."""
        return self.reranker(rerank).stage_model(self.embedder, self._optimization)

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
