"""One search request, as every face builds it (the CLI, REST, the page and the Python API),
and the one place that checks it against a gallery.

A :class:`SearchRequest` is what a user asked: the query (an image, a gallery item by id or by
key, or a vector), ``k``, the filters, the re-ranking, the page (``offset``, ``group_by``,
``group_size``), the query's class and, for a server of several, the gallery's name. A face
turns its input into one, and hands it whole to :meth:`Searcher.run
<nearsight.search.searcher.Searcher.run>`.

:func:`check_request` checks it once (one-line NearsightErrors) into a
:class:`CheckedRequest` that the search route takes: ``k`` as a number, the filters parsed
(their allowed ids are read when the search runs, inside the server's gates), the re-ranking
made ready for the gallery (nearsight.search.rerank.rerankers, built once per gallery), the
page, the query's label, and the query resolved (a key to its item; a vector to unit length).
An image is read when the search runs: a server embeds an upload its own way and hands the
embedding in as an :class:`EmbeddedQuery` (:meth:`CheckedRequest.with_query`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.filters import Condition
from nearsight.search.checks import DEFAULT_K, check_k
from nearsight.search.labels import query_label
from nearsight.search.paging import Page, check_page
from nearsight.search.rerank.rerankers import Reranker
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.route import Filters, check_item_id, check_vector, parse_conditions

if TYPE_CHECKING:  # the searcher imports this module
    from nearsight.search.searcher import Searcher


@dataclass(frozen=True)
class ImageQuery:
    """A query image: a file path, a PIL image, an array H x W (x 3) (read when the search
    runs), or a :class:`~nearsight.data.image_input.QueryImage` a face decoded already."""

    image: Any


@dataclass(frozen=True)
class ItemQuery:
    """A gallery item, by id: its stored embedding is the query."""

    item_id: int


@dataclass(frozen=True)
class KeyQuery:
    """A gallery item, by its key (the gallery's key column, e.g. a SKU)."""

    key: str


@dataclass(frozen=True, eq=False)
class VectorQuery:
    """An embedding of the gallery's dim (made unit length when checked)."""

    vector: Any

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VectorQuery):
            return NotImplemented
        return _same_array(self.vector, other.vector)

    __hash__ = None  # type: ignore[assignment]  # holds an array


@dataclass(frozen=True, eq=False)
class EmbeddedQuery:
    """A query image a face embedded itself (a server's batched model calls): its unit
    ``vector`` [D], the gallery ``item_id`` whose file has its bytes (searched as that item),
    and its stage features ``side`` [1, F] for a re-ranker that takes them."""

    vector: np.ndarray
    item_id: int | None = None
    side: np.ndarray | None = None


Query = ImageQuery | ItemQuery | KeyQuery | VectorQuery | EmbeddedQuery
CheckedQuery = ImageQuery | ItemQuery | VectorQuery | EmbeddedQuery  # keys resolved


@dataclass(frozen=True)
class SearchRequest:
    """What a user asked of a gallery (module docstring). ``rerank``: a spec or its text
    (``"aqe:k=2,alpha=3"``, ``"none"``), None for the gallery's default. ``label``: the query's
    class, as a number or a class name (an item query's is the item's). ``leave_out``: an item
    query leaves the item out of its answer instead of putting it first. ``gallery``: which of
    a server's galleries (None: its first)."""

    query: Query
    k: int = DEFAULT_K
    filters: Filters = None
    rerank: RerankSpec | str | None = None
    offset: int = 0
    group_by: str | None = None
    group_size: int = 1
    label: int | str | None = None
    leave_out: bool = False
    gallery: str | None = None


@dataclass(frozen=True)
class Limits:
    """What a face allows beyond the request's own rules: the largest ``k`` (the page's
    slider), and the distinct filter conditions a request may hold (serve's setting)."""

    max_k: int | None = None
    max_filter_conditions: int | None = None


NO_LIMITS = Limits()


@dataclass(frozen=True, eq=False)
class CheckedRequest:
    """A :class:`SearchRequest` checked against one gallery: what the route takes."""

    request: SearchRequest
    query: CheckedQuery
    k: int
    conditions: tuple[Condition, ...]  # parsed and merged; empty: no filter
    reranker: Reranker
    page: Page
    label: int | None

    @property
    def rerank(self) -> RerankSpec:
        return self.reranker.spec

    @property
    def item_id(self) -> int | None:
        """The gallery item the query names (None: an image or a vector)."""
        return self.query.item_id if isinstance(self.query, ItemQuery) else None

    def with_query(self, query: CheckedQuery) -> CheckedRequest:
        """This request with its query replaced (an upload the face embedded itself)."""
        return dataclasses.replace(self, query=query)


def check_request(
    searcher: Searcher, request: SearchRequest, limits: Limits = NO_LIMITS
) -> CheckedRequest:
    """``request`` checked against ``searcher``'s gallery (module docstring): a one-line
    NearsightError (a FilterError for a filter) when a part is bad."""
    if not isinstance(request, SearchRequest):
        raise NearsightError(f"a search request is a SearchRequest, not {type(request).__name__}")
    if request.gallery not in (None, searcher.name) and searcher.name is not None:
        raise NearsightError(f"a request for gallery {request.gallery!r} reached {searcher.name!r}")
    gallery = searcher.gallery
    query = _checked_query(searcher, request.query)
    k = check_k(request.k, limits.max_k)
    conditions = parse_conditions(request.filters, limits.max_filter_conditions)
    reranker = searcher.reranker(request.rerank)
    page = check_page(gallery, request.offset, request.group_by, request.group_size)
    label = query_label(gallery, request.label)
    if isinstance(query, ItemQuery) and request.label is None:  # an item's class is its own
        label = searcher.label_of(query.item_id)
    return CheckedRequest(request, query, k, conditions, reranker, page, label)


def _checked_query(searcher: Searcher, query: Any) -> CheckedQuery:
    if isinstance(query, ItemQuery):
        item = check_item_id(query.item_id)
        searcher.check_item(item)  # a one-line error for an unknown item
        return ItemQuery(item)
    if isinstance(query, KeyQuery):
        return ItemQuery(searcher.id_of_key(query.key))
    if isinstance(query, VectorQuery):
        return VectorQuery(check_vector(searcher.gallery, query.vector)[:1])
    if isinstance(query, ImageQuery):
        image = query.image
        if isinstance(image, list | tuple) or (isinstance(image, np.ndarray) and image.ndim == 4):
            raise NearsightError(
                "search takes one image; for several, use search_many(images) (one result "
                "per image, an unreadable one reported in its entry instead of stopping)"
            )
        return query
    if isinstance(query, EmbeddedQuery):
        return query
    raise NearsightError(
        "a search request's query is an ImageQuery, ItemQuery, KeyQuery or VectorQuery, not "
        f"{type(query).__name__}"
    )


def _same_array(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, np.float64)))
    except (TypeError, ValueError):
        return a is b
