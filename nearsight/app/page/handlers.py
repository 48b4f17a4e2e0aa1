"""The page's event handlers (:class:`Page`), over the open galleries' views. Each returns what
its Gradio outputs show; nearsight's one-line errors become gr.Error messages."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Sequence
from typing import Any

import gradio as gr

from nearsight.app.page.html import QueryCard, message_html
from nearsight.app.page.inputs import (
    UNKNOWN_CLASS,
    PageError,
    filter_error,
    filter_help,
    filter_note,
    item_box_label,
    item_card,
    item_of,
    label_value,
    no_search,
    page_errors,
    rerank_toggle,
    toggled_rerank,
)
from nearsight.app.page.products import grid_of, grid_request
from nearsight.app.page.tables import (
    FAILURE_ROWS,
    changes_frame,
    distance_frame,
    failure_frame,
    failure_note,
    gallery_header,
    metrics_frame,
    pairs_frame,
    summary_markdown,
)
from nearsight.app.page.uploads import read_upload
from nearsight.app.page.view import GalleryView
from nearsight.app.serve.galleries import Galleries, UnknownGallery
from nearsight.core.errors import NearsightError
from nearsight.data.meta import FilterError
from nearsight.search.checks import DEFAULT_K, check_k
from nearsight.search.request import ImageQuery, ItemQuery, Limits, SearchRequest
from nearsight.search.rerank.changes import MAX_COMPARED_ITEMS, rerank_changes
from nearsight.search.results import SearchResults
from nearsight.search.route import NO_FILTER
from nearsight.search.verdicts import thumbnail_uri

MAX_K = 64
ANY_CLASS = "-1"


class Page:
    """The handlers of the page, over the server's open galleries (their one owner,
    nearsight/app/serve/galleries.py: each event looks its gallery up there once)."""

    def __init__(self, galleries: Galleries[GalleryView] | Sequence[GalleryView]):
        self.galleries = galleries if isinstance(galleries, Galleries) else Galleries(galleries)
        self._random = random.Random()
        self.show_paths = False  # the Summary tab shows folder names only (serve --show-paths)
        self._warm_thread: threading.Thread | None = None

    @property
    def views(self) -> dict[str, GalleryView]:
        """name -> view, the live mapping (read it per event)."""
        return self.galleries.views

    @property
    def names(self) -> list[str]:
        return self.galleries.names

    @property
    def max_filter_conditions(self) -> int | None:
        return self.galleries.max_filter_conditions

    @property
    def limits(self) -> Limits:
        """What a page search may ask: k up to the slider's end, the server's filter bound."""
        return Limits(max_k=MAX_K, max_filter_conditions=self.max_filter_conditions)

    @staticmethod
    def check_k(k: Any) -> int:
        """k as the page takes it (the slider's range), a one-line PageError otherwise."""
        try:
            return check_k(k, MAX_K)
        except NearsightError as error:
            raise PageError(str(error)) from None

    # -- helpers -----------------------------------------------------------------------------

    def view(self, name: str | None) -> GalleryView:
        try:
            return self.galleries.get(name)
        except UnknownGallery as error:
            raise PageError(str(error)) from None

    read_upload = staticmethod(read_upload)  # nearsight/app/page/uploads.py

    def start_analysis(self) -> None:
        """Compute every gallery's leave-one-out analysis in a background thread."""

        def work() -> None:
            for view in self.views.values():
                try:
                    view.analysis()
                except Exception as error:  # shown on the page when it is asked for
                    print(f"nearsight: analysis of {view.name} failed: {error}", flush=True)

        self._warm_thread = threading.Thread(target=work, name="nearsight-analysis", daemon=True)
        self._warm_thread.start()

    def wait_analysis(self, timeout: float | None = None) -> bool:
        if self._warm_thread is not None:
            self._warm_thread.join(timeout)
        return all(view.analysis_ready for view in self.views.values())

    def close(self) -> None:
        """Close the galleries (their owner stops their live reload first)."""
        self.galleries.close()

    # -- searching ---------------------------------------------------------------------------

    def api_search(self, image: str | None, k: Any, gallery: str | None) -> str:
        """The /search endpoint: neighbours of an uploaded image, as JSON text (a list of rows).

        Text, not a JSON component: gradio_client (2.x, protocol sse_v3) takes every dict with
        a "path" string in an output for a file to download, and would try to fetch the gallery
        images (which this server refuses to serve)."""
        with page_errors():
            view = self.view(gallery)
            asked = SearchRequest(ImageQuery(image), DEFAULT_K if k is None else k,
                                  gallery=view.name)  # fmt: skip
            checked = view.check(grid_request(view, asked), self.limits)
            query = self.read_upload(image, view.embedder)
            found = view.run(checked.with_query(ImageQuery(query)))
            return json.dumps([n.as_json() for n in grid_of(found)])

    def image_changed(
        self,
        gallery: str,
        image_path: str | bytes | None,
        k: Any,
        query_class,
        filters: str = "",
        rerank: bool | None = None,
    ):
        """A new query image (uploaded, pasted or dropped); nothing when it was cleared."""
        if not image_path:
            return gr.skip(), gr.skip(), gr.skip()
        return self.upload_grid(gallery, image_path, k, query_class, filters, rerank)

    def upload_grid(
        self,
        gallery: str,
        image_path: str | bytes | None,
        k: Any,
        query_class: str | None,
        filters: str = "",
        rerank: bool | None = None,
    ) -> tuple[str, str, dict]:
        """The grid of an uploaded query; its class from the dropdown, or from an identical
        gallery file when the dropdown says unknown."""
        with page_errors():
            view = self.view(gallery)
            label = label_value(query_class)
            asked = SearchRequest(ImageQuery(image_path), k, filters or None,
                                  self.rerank_spec(view, rerank), label=label,
                                  gallery=view.name)  # fmt: skip
            try:
                checked = view.check(grid_request(view, asked), self.limits)
                query = self.read_upload(image_path, view.embedder)
                found = view.run(checked.with_query(ImageQuery(query)))
            except FilterError as error:  # no stale grid under a filter that was not applied
                return no_search(error), filter_error(error), {"kind": "upload"}
            note = ""
            twin = found.query_item
            if twin is not None:
                twin_label = view.label_of(twin)
                note = f"identical to gallery item #{twin} ({view.class_name(twin_label)})"
                if label is None:
                    label = twin_label
            card = QueryCard(
                title="uploaded image",
                thumbnail=thumbnail_uri(query.image),
                label=label,
                class_name=view.class_name(label),
                kind="upload",
                note=note,
            )
            grid = self._render(view, card, found)
            return grid, filter_note(filters, found.notes), {"kind": "upload"}

    def item_grid(
        self, gallery: str, item_id: Any, k: Any, filters: str = "", rerank: bool | None = None
    ) -> tuple[str, str, dict]:
        """The leave-one-out grid of a gallery item, named by its id or its key."""
        with page_errors():
            view = self.view(gallery)
            item = item_of(view, item_id)
            state = {"kind": "item", "id": item}
            # leave-one-out: the item is the query, its neighbours are the others
            asked = SearchRequest(ItemQuery(item), k, filters or None,
                                  self.rerank_spec(view, rerank), leave_out=True,
                                  gallery=view.name)  # fmt: skip
            try:
                found = view.run(grid_request(view, asked), self.limits)
            except FilterError as error:  # no stale grid under a filter that was not applied
                return no_search(error), filter_error(error), state
            card = item_card(view, item)
            grid = self._render(view, card, found)
            return grid, filter_note(filters, found.notes), state

    def _render(self, view: GalleryView, card: QueryCard, found: SearchResults) -> str:
        # one card per product where the gallery groups by one
        return view.result_grid(card, grid_of(found), found.filtered or NO_FILTER)

    def random_item(
        self,
        gallery: str,
        class_value: str | None,
        k: Any,
        filters: str = "",
        rerank: bool | None = None,
    ):
        with page_errors():
            view = self.view(gallery)
            label = label_value(class_value)
            if label is None:
                pool = view.labelled_ids if len(view.labelled_ids) else view.ids
            else:
                pool = view.ids[view.labels == label]
            if not len(pool):
                raise PageError(f"gallery {view.name} has no item of that class")
            item = int(pool[self._random.randrange(len(pool))])
        grid, status, state = self.item_grid(gallery, item, k, filters, rerank)
        # the item is the query now: the previous upload leaves the query box
        return grid, status, state, self.item_box(view, item), None

    def rerun(
        self,
        gallery: str,
        state: dict | None,
        image_path: str | bytes | None,
        k: Any,
        query_class,
        filters: str = "",
        rerank: bool | None = None,
    ):
        """Redraw the current query (after k, the query class, the filter or the re-rank
        toggle changed)."""
        if not state:
            return gr.skip(), gr.skip(), gr.skip()
        if state.get("kind") == "item":
            return self.item_grid(gallery, state["id"], k, filters, rerank)
        if not image_path:
            return gr.skip(), gr.skip(), gr.skip()
        return self.upload_grid(gallery, image_path, k, query_class, filters, rerank)

    def clicked(self, gallery: str, k: Any, filters: str, rerank: bool, event: gr.EventData):
        """A neighbour was clicked in a grid: query by that item."""
        item = getattr(event, "_data", None) or {}
        if not isinstance(item, dict) or "item_id" not in item:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        grid, status, state = self.item_grid(gallery, int(item["item_id"]), k, filters, rerank)
        return grid, status, state, self.item_box(self.view(gallery), state["id"]), None

    def opened(
        self, gallery: str, item: Any, k: Any, filters: str = "", rerank: bool | None = None
    ):
        """The item box's item (by id or key) is the query; the upload leaves the query box."""
        grid, status, state = self.item_grid(gallery, item, k, filters, rerank)
        return grid, status, state, None

    def item_box(self, view: GalleryView, item: int) -> str:
        """What the item box shows for ``item``: its key when the gallery has keys."""
        key = view.key_of(item)
        return str(item) if key is None else key

    # the re-rank toggle (nearsight/app/page/inputs.py)
    rerank_spec = staticmethod(rerank_toggle)
    rerank_on = staticmethod(toggled_rerank)

    def rerank_changes(self, gallery: str):
        """The Failures tab's table of the queries re-ranking fixes and breaks."""
        with page_errors():
            view = self.view(gallery)
            spec = self.rerank_on(view)
            labelled = len(view.labelled_ids)
            if labelled > MAX_COMPARED_ITEMS:
                raise PageError(
                    f"{labelled} labelled items: the comparison runs up to {MAX_COMPARED_ITEMS}"
                )
            changes = rerank_changes(view.gallery, spec)
            fixed = sum(change.fixed for change in changes)
            note = (
                f"Re-ranking with `{spec.shown}`: **{fixed}** queries fixed, "
                f"**{len(changes) - fixed}** broken (leave-one-out top-1, {labelled} queries)"
            )
            return changes_frame(view, changes[:FAILURE_ROWS]), note

    # -- gallery choice, failures, summary ---------------------------------------------------

    def gallery_changed(self, gallery: str):
        """New gallery chosen (or page loaded): class lists, header, cleared results."""
        view = self.view(gallery)
        classes = [(name, str(label)) for label, name in view.class_names.items()]
        return (
            gr.update(choices=[("unknown", UNKNOWN_CLASS), *classes], value=UNKNOWN_CLASS),
            gr.update(choices=[("any class", ANY_CLASS), *classes], value=ANY_CLASS),
            gallery_header(view),
            message_html("Upload, paste or drop an image, or pick one from the gallery."),
            "",
            None,
            gr.update(info=filter_help(view)),
            gr.update(label=item_box_label(view)),
        )

    def analysis_outputs(self, gallery: str):
        """Failure table, confused pairs, their note, the summary and its plot."""
        view = self.view(gallery)
        analysis = view.analysis()
        return (
            failure_frame(view, analysis.failures[:FAILURE_ROWS]),
            pairs_frame(view, analysis),
            failure_note(view, len(analysis.failures)),
            message_html("Select a row of the failure table to see its grid."),
            summary_markdown(view, self.show_paths),
            metrics_frame(analysis.metrics),
            distance_frame(analysis),
        )

    def failure_selected(self, gallery: str, k: Any, event: gr.SelectData):
        row = event.row_value
        if not row:
            return gr.skip()
        grid, _, _ = self.item_grid(gallery, row[0], k)
        return grid

    def pair_selected(self, gallery: str, k: Any, event: gr.SelectData):
        """A confused pair was selected: the failure table narrows to that pair and the worst
        of them is shown."""
        view = self.view(gallery)
        row = event.row_value
        if not row:
            return gr.skip(), gr.skip(), gr.skip()
        names = {row[0], row[1]}
        chosen = [
            f
            for f in view.analysis().failures
            if {view.class_name(f.label), view.class_name(f.top1_label)} == names
        ]
        note = (
            f"{len(chosen)} failures between **{row[0]}** and **{row[1]}** "
            "(press *Show all failures* for the whole list)"
        )
        grid = (
            self.item_grid(gallery, chosen[0].id, k)[0]
            if chosen
            else message_html("No failure between these classes.")
        )
        return failure_frame(view, chosen[:FAILURE_ROWS]), note, grid

    def all_failures(self, gallery: str):
        view = self.view(gallery)
        failures = view.analysis().failures
        return failure_frame(view, failures[:FAILURE_ROWS]), failure_note(view, len(failures))
