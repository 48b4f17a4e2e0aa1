"""The page's grid of one query, one page at a time, and grouped by product where the gallery
records a group column (``--group-column``, e.g. a SKU: nearsight/search/groups.py).

A grouped grid shows one card per product: its best photo (its nearest item), as a
:class:`ProductHit` that carries the product's value and its photo count (the items the filters
allow that hold the value). Page N of a grid is groups (or ranks) ``N*k + 1`` to ``(N+1)*k`` of
the same search, filters and re-ranking included: the searcher's offset does the paging.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Unpack

import numpy as np

from nearsight.data.meta import MetaValue
from nearsight.search.groups import Group
from nearsight.search.neighbour import Neighbour
from nearsight.search.paging import check_page
from nearsight.search.request import SearchRequest
from nearsight.search.results import SearchResults
from nearsight.search.served import OneQuery, ServedGallery

_NEIGHBOUR_FIELDS = tuple(f.name for f in fields(Neighbour))


@dataclass(frozen=True)
class ProductHit(Neighbour):
    """A product's best photo in a grouped grid, with the product's value and photo count.
    Its ``rank`` is the photo's rank in the ungrouped ranking."""

    group: MetaValue | None = None
    photos: int = 1


def grid_hits(
    view: ServedGallery,
    vector: np.ndarray,
    k: int,
    offset: int = 0,
    **query: Unpack[OneQuery],
) -> list[Neighbour]:
    """One page of the grid of one unit query vector: ranks ``offset + 1`` to ``offset + k``,
    or, where the gallery records a group column, products ``offset + 1`` to ``offset + k``
    as :class:`ProductHit` (``query`` as
    :meth:`~nearsight.search.served.ServedGallery.search_one`'s)."""
    vectors = np.asarray(vector, np.float32).reshape(1, -1)
    route = view.route_of(query)
    column = view.group_column
    if column is None:
        (found,) = view.search_vectors(vectors, k, offset=offset, **route)
        return list(found)
    (groups,) = view.search_page(vectors, k, check_page(view.gallery, offset, column), **route)
    return [_product(group) for group in groups]


def grid_request(view: ServedGallery, request: SearchRequest) -> SearchRequest:
    """``request`` as the page's grid asks it: grouped by the gallery's group column, one
    photo a product, where the gallery records one."""
    column = view.group_column
    if column is None:
        return request
    return dataclasses.replace(request, group_by=column, group_size=1)


def grid_of(found: SearchResults) -> list[Neighbour]:
    """The grid's cards of an answer to a :func:`grid_request`: its hits, or each product's
    best photo as a :class:`ProductHit`."""
    if found.groups is None:
        return list(found)
    return [_product(group) for group in found.groups]


def _product(group: Group) -> ProductHit:
    best = group.neighbours[0]
    same = {name: getattr(best, name) for name in _NEIGHBOUR_FIELDS}
    return ProductHit(**same, group=group.value, photos=group.count)
