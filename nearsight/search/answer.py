"""A checked search request answered: its filters read, its query embedded (an image) or
looked up (an item), the one route run (nearsight.search.route, or nearsight.search.groups
for a grouped page), and the answer typed as :class:`SearchResults` with its notes: values no
item holds of a filter, and what the route says of its answer (a recall a filtered search
cannot promise). Every face gets its answer here, by way of :meth:`Searcher.run
<nearsight.search.searcher.Searcher.run>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nearsight.search.groups import Group
from nearsight.search.neighbour import Neighbour
from nearsight.search.query_embed import embed_queries
from nearsight.search.request import (
    CheckedRequest,
    EmbeddedQuery,
    ImageQuery,
    ItemQuery,
    KeyQuery,
    VectorQuery,
)
from nearsight.search.results import SearchResults
from nearsight.search.route import Filtered, apply_conditions

if TYPE_CHECKING:  # the searcher imports this module
    from nearsight.data.image_input import QueryImage
    from nearsight.search.searcher import Searcher

Found = list[Neighbour] | list[Group]  # one query's answer: neighbours, or groups when grouped


def answer(searcher: Searcher, checked: CheckedRequest) -> SearchResults:
    """The answer to one checked request (module docstring)."""
    filtered = apply_conditions(searcher.gallery, checked.conditions)
    query = checked.query
    item: int | None = None  # the gallery item the query is
    side = None
    exclude = None
    if isinstance(query, ImageQuery):
        vectors, twins, side = embed_queries(
            searcher, [searcher.read_image(query.image)], checked.reranker
        )
        item = twins[0]
    elif isinstance(query, EmbeddedQuery):
        vectors = np.asarray(query.vector, np.float32).reshape(1, -1)
        item, side = query.item_id, query.side
    elif isinstance(query, ItemQuery):
        vectors = searcher.item_vector(query.item_id)[None, :]
        item = query.item_id
        if checked.request.leave_out:  # the other items only: the item is not its own answer
            exclude, item = [query.item_id], None
    else:
        vectors = query.vector
    notes: list[str] = []
    (found,) = search_vectors(searcher, checked, vectors, filtered, [item], side, notes, exclude)
    shown_item = query.item_id if isinstance(query, ItemQuery) else item
    return as_results(searcher, checked, found, filtered, notes, asked(checked), shown_item)


def search_vectors(
    searcher: Searcher,
    checked: CheckedRequest,
    vectors: np.ndarray,
    filtered: Filtered,
    self_ids: Sequence[int | None] | None = None,
    side: np.ndarray | None = None,
    notes: list[str] | None = None,
    exclude: Sequence[int] | None = None,
) -> list[list[Neighbour]] | list[list[Group]]:
    """Query vectors [Q, D] searched under ``checked``'s terms (its query aside: the
    searches of many images, search_many and the CLI's --queries, check their terms once):
    ``self_ids`` per query the gallery item it is; ``side`` the images' stage features."""
    if self_ids is not None and all(i is None for i in self_ids):
        self_ids = None
    return searcher.search_page(
        vectors, checked.k, checked.page, allowed=filtered.allowed, rerank=checked.reranker,
        self_ids=self_ids, exclude=exclude, query_side=side, notes=notes,
    )  # fmt: skip


def search_images(
    searcher: Searcher, checked: CheckedRequest, decoded: Sequence[QueryImage], filtered: Filtered
) -> tuple[list[list[Neighbour]] | list[list[Group]], list[str]]:
    """Decoded query images searched under ``checked``'s terms, embedded together (one whose
    bytes are a gallery item's is searched as that item: nearsight.search.query_embed); and
    the route's notes."""
    vectors, twins, side = embed_queries(searcher, decoded, checked.reranker)
    notes: list[str] = []
    return search_vectors(searcher, checked, vectors, filtered, twins, side, notes), notes


def as_results(
    searcher: Searcher,
    checked: CheckedRequest,
    found: Found,
    filtered: Filtered,
    notes: Sequence[str],
    query: Any,
    item: int | None = None,
    label: int | None = None,
) -> SearchResults:
    """One query's answer: its neighbours, or its groups and their hits in order; the
    filter's notes, then the route's. ``label``: the query's class (default the request's)."""
    label = checked.label if label is None else label
    grouped = checked.page.group_by is not None
    groups = [g for g in found if isinstance(g, Group)] if grouped else None
    hits = (
        cast(list[Neighbour], found)
        if groups is None
        else [hit for g in groups for hit in g.neighbours]
    )
    said = [*filtered.notes, *(note for note in notes if note not in filtered.notes)]
    return SearchResults(
        hits, query=query, query_label=label, notes=said, groups=groups,
        query_class=searcher.label_name(label), query_item=item, filtered=filtered,
        rerank=checked.rerank,
    )  # fmt: skip


def asked(checked: CheckedRequest) -> Any:
    """The query as the caller gave it (``SearchResults.query``): the image, the item's id
    (a key's too), the vector."""
    given = checked.request.query
    if isinstance(given, ImageQuery):
        return given.image
    if isinstance(given, VectorQuery | EmbeddedQuery):
        return given.vector
    if isinstance(given, KeyQuery | ItemQuery):
        return checked.item_id
    return None
