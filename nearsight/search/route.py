"""The one search route, which every surface goes through (the CLI, REST, the page and the
Python API, all by way of :class:`nearsight.search.searcher.Searcher`):

query vectors -> candidates from the index (only the items the filters allow, inside FAISS)
-> re-ranking (when asked) -> exact distances -> typed :class:`Neighbour` rows.

- One ranking per query, whatever ``k``: a longer search never reorders a shorter one's ranks
  (re-ranking re-orders the top ``depth`` candidates of its spec, the index's order after
  them; an HNSW graph explores a fixed window, :func:`candidate_window`), so ``offset``
  pages concatenate to the longer search.
- Distances are exact: each returned item's stored vector is compared with the query in float64
  (``||q - v||`` between unit vectors, 0 to 2), whichever index found it or re-ranking ordered
  it. Without re-ranking, the answer is ordered by these distances.
- A query that is a gallery item (``self_ids``) gets the item itself first, at distance exactly
  0, before any byte-identical duplicate, when the filters allow it. ``exclude`` leaves an item
  out instead (the page's and the evaluation's leave-one-out).
- A caller's input (``k``, the re-rank spec, the filters, a vector's shape) is checked once,
  in one place, as a search request (nearsight.search.request, with :func:`check_k`,
  :func:`parse_conditions`, :func:`check_vector` and the re-ranker registry); :func:`search`
  trusts what it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.ann.faiss_index import HNSW_EF_SEARCH
from nearsight.index.catalog.filters import Condition, merge_conditions, parse_filters
from nearsight.index.catalog.list_columns import gallery_list_columns
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.keys import key_column
from nearsight.search.checks import check_k, check_offset
from nearsight.search.neighbour import Neighbour, neighbour
from nearsight.search.rerank.rerankers import Reranker, build_reranker
from nearsight.search.rerank.search import reranked_search
from nearsight.search.rerank.spec import RerankSpec, parse_rerank

__all__ = ["Filtered", "allowed_ids", "apply_conditions", "check_filters", "check_k", "check_offset", "check_vector", "item_vector",
           "neighbours", "parse_conditions", "ranking", "resolve_rerank", "search"]  # fmt: skip

Filters = str | Sequence[str | Condition] | Mapping[str, Any] | None
HNSW_WINDOW = 128  # ranks an HNSW gallery explores for any shorter search (candidate_window)


@dataclass(frozen=True)
class Filtered:
    """A request's filters, checked: the ``allowed`` ids (None: no filter), ``notes`` on
    values no item holds (nearsight/index/catalog/filter_notes.py) and the ``keys`` filtered
    on (the columns a result card shows next to the key)."""

    allowed: np.ndarray | None
    notes: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


NO_FILTER = Filtered(None)


def item_vector(gallery: Gallery, item_id: int) -> np.ndarray:
    """The stored embedding [1, D] of gallery item ``item_id`` (a one-line error if absent)."""
    row = int(np.searchsorted(gallery.ids, item_id))
    if row >= len(gallery.ids) or int(gallery.ids[row]) != int(item_id):
        raise NearsightError(f"the gallery has no item with id {item_id}")
    return gallery.vectors_of([item_id])


def check_item_id(item_id: Any) -> int:
    """An item id as an int; a one-line error for 3.5, "x" or True."""
    whole_float = isinstance(item_id, float) and item_id.is_integer()
    if isinstance(item_id, bool) or not (
        isinstance(item_id, int | np.integer | str) or whole_float
    ):
        raise NearsightError(f"an item id is a whole number, got {item_id!r}")
    try:
        return int(item_id)
    except ValueError:
        raise NearsightError(f"an item id is a whole number, got {item_id!r}") from None


def check_vector(gallery: Gallery, vector: Any) -> np.ndarray:
    """A caller's query vector(s) as float32 [Q, D], unit length; one-line error otherwise."""
    try:
        array = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        raise NearsightError("a query vector must be a list of numbers") from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != gallery.dim:
        raise NearsightError(
            f"a query vector must have {gallery.dim} numbers (the gallery's dim), got shape "
            f"{tuple(array.shape)}"
        )
    if not np.isfinite(array).all():
        raise NearsightError("a query vector must hold finite numbers")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise NearsightError("a query vector must not be all zeros")
    return np.ascontiguousarray(array / norms)  # the gallery compares directions


def check_filters(
    gallery: Gallery, filters: Filters, max_conditions: int | None = None
) -> Filtered:
    """A caller's filters checked once (:class:`Filtered`): typed by their columns
    (nearsight.index.catalog.filters), repeated conditions counted once; more than
    ``max_conditions`` distinct ones is a FilterError."""
    return apply_conditions(gallery, parse_conditions(filters, max_conditions))


def parse_conditions(filters: Filters, max_conditions: int | None = None) -> tuple[Condition, ...]:
    """A caller's filters parsed and merged, without reading the gallery (repeats count once;
    more than ``max_conditions`` distinct ones is a FilterError)."""
    if filters is None:
        return ()
    if isinstance(filters, str | Mapping):
        conditions = parse_filters(filters)
    else:
        conditions = [
            c for f in filters for c in ([f] if isinstance(f, Condition) else parse_filters(f))
        ]
    return tuple(merge_conditions(conditions, max_conditions))


def apply_conditions(gallery: Gallery, conditions: Sequence[Condition]) -> Filtered:
    """Parsed conditions (:func:`parse_conditions`) read against the gallery: the ids they
    allow, typed by their columns, and notes on values no item holds (:class:`Filtered`)."""
    if not conditions:
        return NO_FILTER
    conditions = list(conditions)
    allowed = gallery.filter_ids(conditions)
    # != holds for every item of another value, and an any-of for one of its values: a value
    # nobody holds is then silent in the count
    differs = any(c.op == "!=" or isinstance(c.value, tuple) for c in conditions)
    notes = tuple(gallery.filter_notes(conditions)) if differs or not len(allowed) else ()
    return Filtered(allowed, notes, tuple(dict.fromkeys(c.key for c in conditions)))


def allowed_ids(
    gallery: Gallery, filters: Filters, max_conditions: int | None = None
) -> np.ndarray | None:
    """Ids meeting every filter, or None when there is no filter (:func:`check_filters`)."""
    return check_filters(gallery, filters, max_conditions).allowed


def stored_rerank(gallery: Gallery) -> RerankSpec:
    """The re-ranking stored in the gallery (``nearsight eval --tune-on ... --save``), else
    none."""
    return parse_rerank(gallery.meta.get("rerank"))


def resolve_rerank(gallery: Gallery, rerank: RerankSpec | str | None) -> RerankSpec:
    """``rerank`` parsed (one-line NearsightError when bad); None: the gallery's stored one."""
    if rerank is None:
        return stored_rerank(gallery)
    try:
        spec = parse_rerank(rerank)
    except ValueError as error:
        raise NearsightError(str(error)) from None
    check_rerank(gallery, spec)
    return spec


def check_rerank(gallery: Gallery, spec: RerankSpec) -> Reranker:
    """A one-line NearsightError now, before any search, when ``spec`` cannot re-rank this
    gallery: a pairwise re-ranker that is missing, trained for another embedding model, or one
    that needs trunk-stage features the gallery does not store. Returns it made ready
    (nearsight.search.rerank.rerankers)."""
    return build_reranker(gallery, spec)


def _query_ids(
    self_ids: Sequence[int | None] | None, exclude: Sequence[int] | np.ndarray | None, count: int
) -> np.ndarray:
    """Per query, the gallery item it is (-1: an image or a vector)."""
    out = np.full(count, -1, dtype=np.int64)
    for source in (exclude, self_ids):
        if source is not None:
            known = [-1 if i is None else int(i) for i in source]
            out = np.where(out < 0, np.asarray(known, dtype=np.int64), out)
    return out


def search(
    gallery: Gallery,
    vectors: np.ndarray,
    k: int,
    *,
    allowed: np.ndarray | None = None,
    rerank: RerankSpec | Reranker,
    self_ids: Sequence[int | None] | None = None,
    exclude: Sequence[int] | np.ndarray | None = None,
    query_side: np.ndarray | None = None,
    rows: Mapping[int, dict[str, Any]] | None = None,
    shown_path: Callable[[Mapping[str, Any]], str] | None = None,
    notes: list[str] | None = None,
    offset: int = 0,
) -> list[list[Neighbour]]:
    """The ``k`` nearest items of each query vector (unit, [Q, D]) as :class:`Neighbour` lists,
    nearest first (module docstring). ``allowed``: the ids the filters allow (None: every
    item). ``self_ids``: per query, the gallery item it is, if any (first, at 0). ``exclude``:
    per query, an item left out. ``query_side``: the query images' stage features [Q, F],
    for a pairwise re-ranker that takes them (nearsight.search.rerank.stage_query; rows of
    item queries are not read). ``rows``: the catalog rows by id where the caller holds them
    in memory (else they are read). ``shown_path``: an item's path as the caller may see it
    (default: the stored path). ``notes``: extended with what the caller should be told about
    the answer, e.g. a recall target a filtered search cannot promise (index.ann.filtered).
    ``offset``: a page: ranks ``offset + 1`` to ``offset + k`` of the search of
    ``offset + k`` items (filters and re-ranking included), ranked as there."""
    ranked = ranking(gallery, vectors, offset + k, allowed=allowed, rerank=rerank,
                     self_ids=self_ids, exclude=exclude, query_side=query_side,
                     notes=notes)  # fmt: skip
    pages = [(ids[offset:], distances[offset:]) for ids, distances in ranked]
    return neighbours(gallery, pages, rows=rows, shown_path=shown_path, first_rank=offset + 1)


Ranking = tuple[list[int], np.ndarray]  # one query's ids and exact distances, in order


def ranking(
    gallery: Gallery,
    vectors: np.ndarray,
    depth: int,
    *,
    allowed: np.ndarray | None = None,
    rerank: RerankSpec | Reranker,
    self_ids: Sequence[int | None] | None = None,
    exclude: Sequence[int] | np.ndarray | None = None,
    query_side: np.ndarray | None = None,
    notes: list[str] | None = None,
) -> list[Ranking]:
    """Per query, the ids and exact distances of its first ``depth`` items in the order
    :func:`search` answers (its arguments), without reading their catalog rows."""
    built = rerank if isinstance(rerank, Reranker) else None
    rerank = rerank.spec if isinstance(rerank, Reranker) else rerank
    queries = np.ascontiguousarray(vectors, dtype=np.float32)
    if queries.ndim == 1:
        queries = queries[None, :]
    info: dict[str, Any] = {}
    window = candidate_window(gallery, depth)
    if rerank.active:
        query_ids = _query_ids(self_ids, exclude, len(queries))
        _, found = reranked_search(gallery, queries, window, rerank, ids=allowed, exclude=exclude,
                                   info=info, query_ids=query_ids, query_side=query_side,
                                   fixed_depth=True, built=built)  # fmt: skip
    else:
        _, found = gallery.search(queries, window, ids=allowed, exclude=exclude, info=info)
    found = found[:, :depth]
    if notes is not None:
        notes.extend(note for note in info.get("notes", []) if note not in notes)
    selves = _selves(self_ids, len(queries), allowed)
    per_query = []
    for q, row_ids in enumerate(found):
        ids = [int(i) for i in row_ids if i >= 0]
        itself = selves[q]
        if itself is not None:
            ids = [itself, *(i for i in ids if i != itself)][:depth]
        distances = exact_distances(gallery, queries[q], ids)
        order = np.arange(len(ids))
        if not rerank.active:  # the index's order, made exact (approximate types differ)
            order = np.lexsort((np.asarray(ids), distances))
        if selves[q] is not None:  # before a duplicate at the same distance 0
            order = np.array([0, *(o for o in order if o != 0)], dtype=np.int64)
        ids, distances = [ids[o] for o in order], distances[order]
        per_query.append((ids, distances))
    return per_query


def candidate_window(gallery: Gallery, depth: int) -> int:
    """How many items to ask the index for, to answer the first ``depth``. An HNSW graph
    explores as broadly as the k it is asked for (efSearch at least), so it is asked for a
    whole window, :data:`HNSW_WINDOW` ranks (or its efSearch, if broader), doubled while
    shorter than ``depth``: every depth inside one window gets the same exploration, and pages
    agree with a longer search inside it. Other types give the same order for any k."""
    if gallery.index_type != "hnsw":
        return depth
    window = max(HNSW_WINDOW, int(gallery.meta.get("ef_search", HNSW_EF_SEARCH)))
    while window < depth:
        window *= 2
    return window


def neighbours(
    gallery: Gallery,
    ranked: Sequence[Ranking],
    *,
    rows: Mapping[int, dict[str, Any]] | None = None,
    shown_path: Callable[[Mapping[str, Any]], str] | None = None,
    first_rank: int = 1,
) -> list[list[Neighbour]]:
    """Each query's ranked ids as :class:`Neighbour` s, ranked from ``first_rank`` on; rows
    and paths as in :func:`search`."""
    if rows is None:
        wanted = sorted({i for ids, _ in ranked for i in ids})
        rows = {row["id"]: row for row in gallery.items(wanted)} if wanted else {}
    column, tags = key_column(gallery), gallery_list_columns(gallery.meta)
    show = shown_path or (lambda row: str(row["path"]))
    return [
        [
            neighbour(rank, rows[i], float(d), show(rows[i]), column, tags)
            for rank, (i, d) in enumerate(zip(ids, distances, strict=True), start=first_rank)
        ]
        for ids, distances in ranked
    ]


def exact_distances(gallery: Gallery, query: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """float64 Euclidean distances from ``query`` to the stored vectors of ``ids``: exactly 0
    for the item's own vector (as ``sqrt(2 - 2 q.v)`` in float32 is not)."""
    if not len(ids):
        return np.zeros(0, dtype=np.float64)
    stored = np.asarray(gallery.vectors_of(np.asarray(ids, dtype=np.int64)), dtype=np.float64)
    return np.linalg.norm(stored - np.asarray(query, dtype=np.float64)[None, :], axis=1)


def _selves(
    self_ids: Sequence[int | None] | None, count: int, allowed: np.ndarray | None
) -> list[int | None]:
    """Per query, the item to put first: its own id, where the filters allow it."""
    if self_ids is None:
        return [None] * count
    if len(self_ids) != count:
        raise ValueError(f"{len(self_ids)} self ids for {count} queries")
    return [
        None
        if item is None or (allowed is not None and not _contains(allowed, int(item)))
        else int(item)
        for item in self_ids
    ]


def _contains(sorted_ids: np.ndarray, item: int) -> bool:
    position = int(np.searchsorted(sorted_ids, item))
    return position < len(sorted_ids) and int(sorted_ids[position]) == item


def item_row(item: dict[str, Any], path: str | None = None) -> dict[str, Any]:
    """A catalog row as JSON (``GET /api/items/{id}``), its path as ``path`` when given."""
    row = {
        key: item.get(key)
        for key in ("id", "path", "label", "class_name", "split", "sha256", "width", "height")
    }
    if path is not None:
        row["path"] = path
    return row | {"meta": dict(item.get("meta") or {})}
