"""The page's "more" control: under the result grid, it adds the next page of the same search
(the same query, filters and re-ranking; ``offset`` k further) to the grid, so that after N
clicks the grid is ranks 1 to (N+1)*k of one long search, or, on a gallery grouped by product,
products 1 to (N+1)*k (nearsight/app/page/products.py).

The grid's state (``{"kind": "upload"}`` or ``{"kind": "item", "id": N}``, set by each new
search in nearsight/app/page/handlers.py) gains ``pages``: how many pages the grid shows. A
new search, or a change of k, the filter or the re-rank toggle, starts again at one page. Each
click searches each shown page again by its offset (the grid is not kept on the server).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gradio as gr

from nearsight.app.page.handlers import Page
from nearsight.app.page.html import QueryCard
from nearsight.app.page.inputs import (
    PageError,
    filter_error,
    filter_note,
    item_card,
    label_value,
    no_search,
    page_errors,
)
from nearsight.app.page.products import grid_of, grid_request
from nearsight.app.page.view import GalleryView
from nearsight.data.meta import FilterError
from nearsight.search.neighbour import Neighbour
from nearsight.search.request import (
    CheckedQuery,
    CheckedRequest,
    EmbeddedQuery,
    ImageQuery,
    ItemQuery,
    SearchRequest,
)
from nearsight.search.route import NO_FILTER
from nearsight.search.verdicts import thumbnail_uri

MAX_SHOWN = 256  # cards one grid may grow to (each carries an inline thumbnail)


class More:
    """The "more" handler over the page's handlers (:class:`Page`)."""

    def __init__(self, page: Page):
        self.page = page

    def more(
        self,
        gallery: str,
        state: dict | None,
        image_path: str | bytes | None,
        k: Any,
        query_class: str | None,
        filters: str = "",
        rerank: bool | None = None,
    ):
        """The grid with one more page; nothing when there is no search yet."""
        if not state or state.get("kind") not in ("upload", "item"):
            return gr.skip(), gr.skip(), gr.skip()
        page = self.page
        with page_errors():
            view = page.view(gallery)
            k = page.check_k(k)
            pages = int(state.get("pages", 1)) + 1
            if pages * k > MAX_SHOWN:
                raise PageError(f"the grid shows at most {MAX_SHOWN} cards: search again, or "
                                "narrow the search with a filter")  # fmt: skip
            item = state["kind"] == "item"
            asked = grid_request(view, SearchRequest(
                ItemQuery(int(state["id"])) if item else ImageQuery(image_path), k,
                filters or None, page.rerank_spec(view, rerank), leave_out=item,
                gallery=view.name))  # fmt: skip
            try:
                checked = view.check(asked, page.limits)
                card, query = self._query(view, state, image_path, query_class, checked)
                hits: list[Neighbour] = []
                notes: list[str] = []
                for number in range(pages):  # page N: offset N*k, as the long search ranks it
                    shown = view.check(replace(asked, offset=number * k), page.limits)
                    answer = view.run(shown.with_query(query))
                    found = grid_of(answer)
                    hits += found
                    notes += [note for note in answer.notes if note not in notes]
                    if len(found) < k:  # the search has no more
                        break
            except FilterError as error:
                return no_search(error), filter_error(error), state
            grid = view.result_grid(card, hits, answer.filtered or NO_FILTER)
            status = filter_note(filters, notes)
            if len(hits) < pages * k:
                status = (status + "\n\n" if status else "") + "No more results."
            return grid, status, {**state, "pages": pages}

    def _query(
        self,
        view: GalleryView,
        state: dict,
        image_path: str | bytes | None,
        query_class: str | None,
        checked: CheckedRequest,
    ) -> tuple[QueryCard, CheckedQuery]:
        """The grid's query card and its query as every page searches it (an upload embedded
        once), as the first page had them (nearsight/app/page/handlers.py: ``upload_grid``,
        ``item_grid``)."""
        if state["kind"] == "item":
            item = int(state["id"])
            card = item_card(view, item)
            return card, checked.query
        query = self.page.read_upload(image_path, view.embedder)
        vector, twin, side = view.query_embedding(query, checked.reranker)
        label = label_value(query_class)
        note = ""
        if twin is not None:
            twin_label = view.label_of(twin)
            note = f"identical to gallery item #{twin} ({view.class_name(twin_label)})"
            label = twin_label if label is None else label
        card = QueryCard(
            title="uploaded image",
            thumbnail=thumbnail_uri(query.image),
            label=label,
            class_name=view.class_name(label),
            kind="upload",
            note=note,
        )
        return card, EmbeddedQuery(vector, twin, side)
