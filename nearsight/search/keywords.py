"""The Python API's searches by keyword (``Searcher.search``, ``search_vector``,
``search_item``, ``search_many``): each builds one :class:`~nearsight.search.request.
SearchRequest` and hands it to :meth:`Searcher.run <nearsight.search.searcher.Searcher.run>`,
as every other face does; a filter value no item holds is also a :class:`FilterNote` warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.image_input import ImageLike, QueryImage
from nearsight.search.answer import as_results, search_images
from nearsight.search.labels import query_label
from nearsight.search.request import (
    NO_LIMITS,
    CheckedRequest,
    ImageQuery,
    ItemQuery,
    KeyQuery,
    Limits,
    SearchRequest,
    VectorQuery,
)
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.results import ResultsList, SearchResults
from nearsight.search.route import Filtered, Filters, apply_conditions

if TYPE_CHECKING:
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.searcher import Searcher

Rerank = RerankSpec | str | None
SEARCH_BATCH = 64  # search_many: images decoded, embedded and searched at a time


class KeywordSearches:
    """The keyword methods of :class:`~nearsight.search.searcher.Searcher` (a base class of
    it: they need its gallery, :meth:`check`, :meth:`run` and :meth:`read_image`)."""

    if TYPE_CHECKING:  # the Searcher's, declared for the type checker
        gallery: Gallery

        def check(self, request: SearchRequest, limits: Limits = NO_LIMITS) -> CheckedRequest: ...

        def run(
            self, request: SearchRequest | CheckedRequest, limits: Limits = NO_LIMITS
        ) -> SearchResults: ...

        def read_image(self, image: ImageLike | QueryImage) -> QueryImage: ...

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
        An unreadable image raises NearsightError; several images go to :meth:`search_many`.
        A filter value no item holds is a :class:`FilterNote` warning (and a note)."""
        request = SearchRequest(ImageQuery(image), k, filters, rerank, offset, group_by,
                                group_size, label)  # fmt: skip
        return _warned(self.run(request))

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
        request = SearchRequest(VectorQuery(vector), k, filters, rerank, offset, group_by,
                                group_size, label)  # fmt: skip
        return _warned(self.run(request))

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
        query = KeyQuery(str(key)) if key is not None else ItemQuery(cast(int, item_id))
        request = SearchRequest(query, k, filters, rerank, offset, group_by, group_size,
                                leave_out=leave_out)  # fmt: skip
        return _warned(self.run(request))

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
        # the terms, checked once for every image: bad input fails before any image is read
        terms = SearchRequest(ImageQuery(None), k, filters, rerank, offset, group_by, group_size)
        checked = self.check(terms)
        queries = list(images)
        given = [None] * len(queries) if labels is None else list(labels)
        if len(given) != len(queries):
            raise NearsightError(f"{len(given)} labels for {len(queries)} images")
        wanted = [query_label(self.gallery, label) for label in given]
        filtered = _warned_filter(apply_conditions(self.gallery, checked.conditions))
        searcher = cast("Searcher", self)  # this is the Searcher's base class
        answers = ResultsList()
        for start in range(0, len(queries), batch_size):
            chunk = queries[start : start + batch_size]
            entries: list[SearchResults | None] = [None] * len(chunk)
            decoded, positions = [], []
            for position, image in enumerate(chunk):
                try:
                    decoded.append(self.read_image(image))
                    positions.append(position)
                except NearsightError as error:  # this image only: the others go on
                    entries[position] = SearchResults(query=image, error=str(error))
            found, notes = (
                search_images(searcher, checked, decoded, filtered) if decoded else ([], [])
            )
            for index, position in enumerate(positions):
                entries[position] = as_results(searcher, checked, found[index], filtered, notes,
                                               chunk[position], label=wanted[start + position])  # fmt: skip
            answers.extend(entries)
        return answers


class FilterNote(UserWarning):
    """A filter value no item holds (the message names the closest values held)."""


def _warned(found: SearchResults) -> SearchResults:
    """A Python caller's answer, its filter's notes also warned (:class:`FilterNote`)."""
    if found.filtered is not None:
        _warned_filter(found.filtered, stacklevel=4)
    return found


def _warned_filter(filtered: Filtered, stacklevel: int = 3) -> Filtered:
    for note in filtered.notes:
        warnings.warn(note, FilterNote, stacklevel=stacklevel)
    return filtered
