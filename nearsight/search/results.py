"""Search results for notebooks and scripts: what ``Searcher.search`` and ``search_many``
return.

:class:`SearchResults` is the list of :class:`~nearsight.search.neighbour.Neighbour` s of one
query (rank, id, key, path, label, class_name, distance, meta; each readable as ``n.id`` or
``n["id"]``), so code that loops over it keeps working; it adds :meth:`~SearchResults.to_pandas` (one row per neighbour, ``meta`` flattened
into columns) and an HTML grid that Jupyter shows by itself, framed as the page frames it:
green when a neighbour's class is the query's, red when not, grey when the query's class is not
known. :class:`ResultsList` holds one :class:`SearchResults` per query of ``search_many``; a
query that could not be read is an empty entry with its ``error``.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import fit_file
from nearsight.data.image_input import as_image
from nearsight.search.groups import Group
from nearsight.search.neighbour import FIELDS, Neighbour
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.route import Filtered
from nearsight.search.verdicts import FRAME_COLOURS, QUERY_COLOUR, correctness, thumbnail_uri

NOTEBOOK_THUMBNAIL = 96  # pixels, the longer side of a notebook grid's thumbnails
HTML_MAX_QUERIES = 20  # queries drawn by ResultsList's grid; the rest are counted
COLUMNS = tuple(name for name in FIELDS if name != "meta")

_CELL = (
    "display:inline-block;vertical-align:top;margin:2px;padding:2px;border:3px solid {colour};"
    "border-radius:6px;width:{side}px;font-size:11px;line-height:1.3;overflow-wrap:anywhere"
)
_IMAGE = "display:block;width:{side}px;height:{side}px;object-fit:contain"


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise NearsightError("to_pandas() needs pandas: pip install pandas") from None
    return pandas


class SearchResults(list):
    """The neighbours of one query, nearest first (a list of Neighbour).

    ``query``: the query as given (a path, an image, an array; a gallery item's id for
    ``search_item``); ``query_label``: its class when known (``search(..., label=L)``, or the
    item's own for ``search_item``), for the colouring and the ``correct`` column; ``error``:
    why the query gave no neighbours (``search_many`` only); ``notes``: what the search says
    about its answer (a recall target a filtered search cannot promise), empty when none;
    ``groups``: a grouped search's :class:`~nearsight.search.groups.Group` s (the list holds
    their hits, group after group), None when not grouped; ``query_item``: the gallery item
    the query is (an item's search, or an image with an item's bytes), else None;
    ``filtered``: the filters as read (the ids they allow, their keys), None without;
    ``rerank``: the re-ranking the search ran."""

    def __init__(
        self,
        rows: Iterable[Neighbour] = (),
        *,
        query: Any = None,
        query_label: int | None = None,
        error: str | None = None,
        query_class: str | None = None,
        notes: list[str] | None = None,
        groups: list[Group] | None = None,
        query_item: int | None = None,
        filtered: Filtered | None = None,
        rerank: RerankSpec | None = None,
    ) -> None:
        super().__init__(rows)
        self.groups = groups  # a grouped search's groups (search(group_by=...)), else None
        self.query = query
        self.query_label = query_label
        self.query_class = query_class  # the query's class name, when known
        self.error = error
        self.notes = list(notes or [])
        self.query_item = query_item
        self.filtered = filtered
        self.rerank = rerank

    def records(self, reserved: Iterable[str] = ()) -> list[dict[str, Any]]:
        """One flat dict per neighbour: the fixed columns, then ``meta``'s keys (a key that
        clashes with a fixed column, ``correct`` or a ``reserved`` name gets a ``meta.``
        prefix), then ``correct`` when the query's class is known (True, False, or None for an
        unlabelled neighbour)."""
        taken = {"correct", *reserved}
        rows = []
        for hit in self:
            row = {key: hit.get(key) for key in COLUMNS}
            for key, value in (hit.get("meta") or {}).items():
                row[f"meta.{key}" if key in row or key in taken else key] = value
            if self.query_label is not None:
                verdict = correctness(self.query_label, hit.get("label"))
                row["correct"] = None if verdict == "unknown" else verdict == "true"
            rows.append(row)
        return rows

    def to_pandas(self) -> Any:
        """A pandas DataFrame, one row per neighbour (columns: :meth:`records`)."""
        pandas = _pandas()
        columns = list(COLUMNS)
        records = self.records()
        for row in records:
            columns += [key for key in row if key not in columns]
        return _whole_numbers(pandas.DataFrame.from_records(records, columns=columns))

    def _repr_html_(self) -> str:
        return _query_html(self)

    def __repr__(self) -> str:
        if self.error is not None:
            return f"SearchResults(error={self.error!r})"
        return f"SearchResults({list.__repr__(self)})"


class ResultsList(list):
    """One :class:`SearchResults` per query of ``search_many``, in the order given."""

    @property
    def errors(self) -> dict[int, str]:
        """Query position -> why it gave no neighbours (an unreadable file...)."""
        return {n: r.error for n, r in enumerate(self) if r.error is not None}

    def to_pandas(self) -> Any:
        """One DataFrame for all queries: a ``query`` column (the query's position) and, when
        queries were files, ``query_path``; then :meth:`SearchResults.records`' columns; an
        ``error`` column when a query failed."""
        pandas = _pandas()
        paths = any(isinstance(r.query, str | os.PathLike) for r in self)
        fixed = ["query", *(["query_path"] if paths else []), "error"]
        columns = [*fixed[:-1], *COLUMNS]
        records: list[dict[str, Any]] = []
        for number, results in enumerate(self):
            query: dict[str, Any] = {"query": number}
            if paths:
                is_path = isinstance(results.query, str | os.PathLike)
                query["query_path"] = os.fspath(results.query) if is_path else None
            if results.error is not None:
                records.append({**query, "error": results.error})
            records += [{**query, **row} for row in results.records(reserved=fixed)]
        for row in records:
            columns += [key for key in row if key not in columns]
        return _whole_numbers(pandas.DataFrame.from_records(records, columns=columns))

    def _repr_html_(self) -> str:
        shown = [_query_html(results, number) for number, results in enumerate(self)]
        more = len(shown) - HTML_MAX_QUERIES
        parts = shown[:HTML_MAX_QUERIES]
        if more > 0:
            parts.append(f"<div>… and {more} more queries (index this list to see one)</div>")
        return "".join(parts) or "<div>no queries</div>"


def _whole_numbers(frame: Any) -> Any:
    """Ids, ranks and labels as whole numbers (pandas' nullable Int64), also where a failed
    query's row or an unlabelled item leaves a gap (a plain column would turn into floats)."""
    for column in ("query", "rank", "id", "label"):
        if column in frame.columns:
            frame[column] = frame[column].astype("Int64")
    return frame


def _thumbnail(image: Any) -> str | None:
    """A data URI of a query or a gallery file, or None when it cannot be shown."""
    try:
        if isinstance(image, Image.Image):
            picture = image
        elif isinstance(image, np.ndarray):
            picture = as_image(image)
        elif isinstance(image, str | os.PathLike):
            picture = fit_file(Path(image), NOTEBOOK_THUMBNAIL).image  # in the decode box
        else:
            return None
        return thumbnail_uri(picture, NOTEBOOK_THUMBNAIL)
    except (NearsightError, OSError, ValueError):
        return None


def _cell(uri: str | None, colour: str, caption: str, title: str, verdict: str = "") -> str:
    side = NOTEBOOK_THUMBNAIL
    if uri is None:
        picture = f'<div style="{_IMAGE.format(side=side)};opacity:0.6">no image</div>'
    else:
        picture = f'<img src="{html.escape(uri, quote=True)}" style="{_IMAGE.format(side=side)}">'
    data = f' data-correct="{verdict}"' if verdict else ""
    return (
        f'<div class="ns-cell"{data} title="{html.escape(title, quote=True)}" '
        f'style="{_CELL.format(colour=colour, side=side)}">{picture}{caption}</div>'
    )


def _distance(value: float | None) -> str:
    return "-" if value is None else f"{float(value):.3f}"


def _query_html(results: SearchResults, number: int | None = None) -> str:
    e = html.escape
    heading = "query" if number is None else f"query {number}"
    query = results.query
    if isinstance(query, int | np.integer) and not isinstance(query, bool):
        title, picture = f"gallery item {query}", None
        first = next((hit for hit in results if hit.get("id") == int(query)), None)
        if first is not None:
            picture = _thumbnail(first.get("path"))
    else:
        title = str(query) if isinstance(query, str | os.PathLike) else type(query).__name__
        picture = _thumbnail(query)
    name = results.query_class or (
        None if results.query_label is None else f"class {results.query_label}"
    )
    label = "" if name is None else f"<br>{e(name)}"
    cells = [_cell(picture, QUERY_COLOUR, f"<b>{e(heading)}</b>{label}", title)]
    if results.error is not None:
        cells.append(f'<div class="ns-error" style="color:#dc2626">{e(results.error)}</div>')
    for hit in results:
        verdict = correctness(results.query_label, hit.get("label"))
        name = hit.get("class_name") or ("" if hit.get("label") is None else hit.get("label"))
        caption = (
            f"<b>#{hit.get('rank')}</b> {e(str(name))}<br>"
            f"d {_distance(hit.get('distance'))} · id {hit.get('id')}"
        )
        cells.append(
            _cell(
                _thumbnail(hit.get("path")),
                FRAME_COLOURS[verdict],
                caption,
                f"id {hit.get('id')}: {hit.get('path')}",
                verdict,
            )
        )
    return f'<div class="ns-results" style="margin-bottom:8px">{"".join(cells)}</div>'
