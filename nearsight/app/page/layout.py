"""The Gradio page of `nearsight serve`: query a gallery by image and see its top-k, framed
green (the query's class) or red (another class); inspect the gallery's leave-one-out failures;
read its Recall@k and its pair-distance distributions.

This module is the page's layout; its handlers are in nearsight/app/page/handlers.py, its tables in
nearsight/app/page/tables.py, the galleries it shows in nearsight/app/page/view.py.

Build with :func:`build_app`, start with :func:`nearsight.app.server_app.launch_app` (which mounts
it into nearsight's own app with the safety settings: upload size limit, no file serving beyond
Gradio's own upload cache, no analytics, a system-font theme so that the page fetches nothing
from the internet). Its searches wait their turn in fair gates (nearsight/app/page/gated.py).

Endpoint for gradio_client: ``/search`` (image file, k, gallery name) -> JSON text of the list
of the k nearest items, ``{"id", "path", "label", "class_name", "distance", "meta"}``, nearest
first (on a gallery with a group column, as the page's grid: each product's best photo,
nearsight/app/page/products.py; the JSON routes under ``/api`` are nearsight/app/rest/,
mounted beside it)::

    neighbours = json.loads(Client(url).predict(handle_file("q.jpg"), api_name="/search"))

The page's own events are callable too but undocumented.

Safety decisions (see also nearsight/app/page/html.py):

- Gallery images reach the browser only as small JPEG thumbnails inlined into the result HTML,
  made on the server from catalog paths looked up by id. No gallery folder is in Gradio's
  ``allowed_paths``, so ``/gradio_api/file=`` serves nothing but Gradio's upload cache; the
  gallery folders are in ``blocked_paths`` besides. No path from a request is ever opened.
- Uploads larger than ``max_upload_mb`` are refused by Gradio's upload route (HTTP 413); an
  upload that is not an image is answered with a one-line message (gr.Error), never a crash.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import Any

import gradio as gr

from nearsight.app.page.analysis_tabs import (
    analysis_outputs,
    failures_tab_layout,
    summary_tab_layout,
    wire_failures_tab,
)
from nearsight.app.page.facets_box import facet_dropdown, wire_facets
from nearsight.app.page.gated import PageGates
from nearsight.app.page.handlers import ANY_CLASS, DEFAULT_K, MAX_K, UNKNOWN_CLASS, Page
from nearsight.app.page.html import CLICK_JS, message_html
from nearsight.app.page.inputs import filter_help, item_box_label
from nearsight.app.page.inspect_tab import inspect_tab
from nearsight.app.page.map_tab import MapTab, map_tab_layout, wire_map_tab
from nearsight.app.page.more import More
from nearsight.app.page.tables import (
    gallery_header,
)
from nearsight.app.page.view import GalleryView
from nearsight.app.serve.galleries import Galleries
from nearsight.search.analysis import ANALYSIS_MAX_ITEMS
from nearsight.search.rerank.spec import RerankSpec, parse_rerank

DEFAULT_CONCURRENCY = 2  # embedding calls at once (each one uses every core already)
DEFAULT_MAX_QUEUE = 64  # waiting events beyond this are refused ("queue full")
UPLOAD_CACHE_S = (60, 60)  # Gradio's delete_cache: (every N s, files older than N s)


def query_image_input(**options: Any) -> gr.Image:
    """gr.Image whose handlers get the uploaded file's path, or a pasted data: URL's bytes,
    without Gradio decoding it first: the handlers decode it in the decode box
    (nearsight.data.decode_box), and a file that is not an image gets nearsight's one-line
    message instead of a Pillow traceback. (An instance override, not a subclass: Gradio
    writes a .pyi stub beside the module of every Component subclass.)"""
    image = gr.Image(type="filepath", **options)

    def preprocess(payload):
        if payload is None:
            return None
        url = payload.url or ""
        if payload.path and not url.startswith("data:"):
            return str(payload.path)  # Gradio has checked it is in its upload folder
        if url.startswith("data:"):  # within the request body's limit already
            try:
                return base64.b64decode(url.partition(",")[2], validate=True)
            except ValueError:
                raise gr.Error("cannot read the pasted image: not base64 data") from None
        raise gr.Error("no query image: upload, paste or drop one")

    image.preprocess = preprocess  # type: ignore[method-assign]
    return image


# -- the Blocks --------------------------------------------------------------------------------


class PageBlocks(gr.Blocks):
    """The page's Blocks, with its parts declared: ``nearsight`` the :class:`Page` (its
    handlers and the open galleries' owner, ``nearsight.galleries``, which the REST API reads
    too), ``nearsight_maps`` the Map tab."""

    nearsight: Page
    nearsight_maps: MapTab


def build_app(
    galleries: Sequence[str | os.PathLike[str]] | Sequence[GalleryView] | Galleries,
    model: str | os.PathLike[str] | None = None,
    *,
    device: str = "auto",
    concurrency: int = DEFAULT_CONCURRENCY,
    max_queue: int = DEFAULT_MAX_QUEUE,
    analyse: bool = True,
    analysis_max_items: int = ANALYSIS_MAX_ITEMS,
    show_paths: bool = False,
    rerank: RerankSpec | str | None = None,
    card_fields: Sequence[str] | None = None,
) -> PageBlocks:
    """The page over ``galleries`` (folders, views already open, or their owner). ``model``:
    the model that embeds uploads (default: each gallery's recorded model; it must match).
    ``analyse``: start the leave-one-out analysis in the background now (otherwise on first
    use); galleries with more than ``analysis_max_items`` labelled items are not analysed.
    ``card_fields``: the metadata fields result cards lead with (default: the gallery's key
    column). The returned Blocks has ``.nearsight`` (the :class:`Page`); serve it with
    nearsight.app.server_app."""
    if isinstance(galleries, Galleries):
        owner = galleries
    elif galleries and isinstance(galleries[0], GalleryView):
        owner = Galleries(list(galleries))
        for view in owner:
            view.show_paths = show_paths
            view.rerank_override = parse_rerank(rerank) if isinstance(rerank, str) else rerank
            if card_fields:
                view.card_fields = list(card_fields)
                view.check_card_fields()
    else:
        owner = Galleries.open(galleries, model, device=device, kind=GalleryView,  # type: ignore[arg-type]
                               show_paths=show_paths, rerank=rerank, card_fields=card_fields)  # fmt: skip
    for view in owner:
        view.analysis_max_items = analysis_max_items
    page = Page(owner)
    page.show_paths = show_paths
    maps = MapTab(page.views)
    first = page.names[0]

    # uploads are removed from Gradio's cache a minute after they arrive (and all at exit)
    with PageBlocks(
        title="nearsight", analytics_enabled=False, delete_cache=UPLOAD_CACHE_S
    ) as demo:
        gr.Markdown(
            "## nearsight\nQuery a gallery by image. Frames: **green** = the query's class, "
            "**red** = another class, grey = the query's class is unknown."
        )
        with gr.Row(equal_height=True):
            gallery_choice = gr.Dropdown(
                choices=page.names,
                value=first,
                label="Gallery",
                interactive=len(page.names) > 1,
                scale=1,
                elem_id="ns-gallery",
            )
            header = gr.Markdown(gallery_header(page.views[first]), elem_id="ns-header")
        state = gr.State(None)

        with gr.Tabs():
            with gr.Tab("Search", id="search"), gr.Row():
                with gr.Column(scale=1, min_width=280):
                    query_image = query_image_input(
                        label="Query image",
                        sources=["upload", "webcam", "clipboard"],
                        height=260,
                        elem_id="ns-query-image",
                    )
                    query_class = gr.Dropdown(
                        label="Query class (colours the frames; unknown = grey)",
                        choices=[("unknown", UNKNOWN_CLASS)],
                        value=UNKNOWN_CLASS,
                        elem_id="ns-query-class",
                    )
                    k_slider = gr.Slider(
                        1, MAX_K, value=DEFAULT_K, step=1, label="k", elem_id="ns-k"
                    )
                    filter_box = gr.Textbox(
                        label="Filter (search only matching items; Enter applies)",
                        placeholder="shop=north; price<20",
                        info=filter_help(page.views[first]),
                        elem_id="ns-filter",
                    )
                    facets = facet_dropdown()
                    rerank_box = gr.Checkbox(
                        value=page.views[first].rerank.active,
                        label="Re-rank the candidates",
                        info=_rerank_info(page),
                        elem_id="ns-rerank",
                    )
                    search_button = gr.Button("Search", variant="primary", elem_id="ns-search")
                    with gr.Accordion("Query from the gallery (leave-one-out)", open=True):
                        pick_class = gr.Dropdown(
                            label="Class",
                            choices=[("any class", ANY_CLASS)],
                            value=ANY_CLASS,
                            elem_id="ns-pick-class",
                        )
                        random_button = gr.Button("Random gallery image", elem_id="ns-random")
                        item_id = gr.Textbox(
                            label=item_box_label(page.views[first]),
                            lines=1,
                            max_lines=1,
                            elem_id="ns-item-id",
                        )
                        open_button = gr.Button("Open item", elem_id="ns-open")
                with gr.Column(scale=3):
                    status = gr.Markdown(elem_id="ns-status")
                    results = gr.HTML(
                        message_html("Upload, paste or drop an image, or pick one."),
                        elem_id="ns-results",
                        js_on_load=CLICK_JS,
                    )
                    more_button = gr.Button("More", size="sm", elem_id="ns-more")

            failures = failures_tab_layout()

            map_parts = map_tab_layout()
            inspect_tab(page, gallery_choice, k_slider)

            summary = summary_tab_layout()

        # the documented API: image file in, JSON neighbours out (hidden from the page)
        with gr.Row(visible=False):
            api_image = gr.File(label="image", type="filepath")
            api_k = gr.Number(value=DEFAULT_K, precision=0, label="k")
            api_gallery = gr.Textbox(value=first, label="gallery")
            api_result = gr.Textbox(label="neighbours (JSON)")
            api_button = gr.Button("search")

        gates = PageGates(concurrency, max_queue)
        embed_limits: dict[str, Any] = {"concurrency_id": "embed", **gates.limits}
        private: dict[str, Any] = {"api_visibility": "undocumented"}

        def embedding(handler: Any) -> Any:  # an upload's search: the embed gate
            return gates.through(gates.embed, handler)

        def searching(handler: Any) -> Any:  # a gallery item's search: the search gate
            return gates.through(gates.search, handler)

        search_limits = {**private, **gates.limits}
        grid_out = [results, status, state]

        api_button.click(
            embedding(page.api_search),
            [api_image, api_k, api_gallery],
            api_result,
            api_name="search",
            api_description="The k nearest gallery items of an image, as JSON text: a list of "
            '{"id", "path", "label", "class_name", "distance", "meta"}, nearest first.',
            **embed_limits,
        )
        upload_inputs = [
            gallery_choice, query_image, k_slider, query_class, filter_box, rerank_box,
        ]  # fmt: skip
        # change, not upload: a pasted image counts too; clearing the image changes nothing
        query_image.change(
            embedding(page.image_changed),
            upload_inputs,
            grid_out,
            api_name="image_changed",
            **private,
            **embed_limits,
        )
        search_button.click(
            embedding(page.upload_grid),
            upload_inputs,
            grid_out,
            api_name="search_grid",
            **private,
            **embed_limits,
        )
        rerun_inputs = [
            gallery_choice, state, query_image, k_slider, query_class, filter_box, rerank_box,
        ]  # fmt: skip
        rerun = searching(page.rerun)
        rerank_box.input(rerun, rerun_inputs, grid_out, api_name="rerun_rerank", **search_limits)
        k_slider.release(rerun, rerun_inputs, grid_out, api_name="rerun_k", **search_limits)
        filter_box.submit(rerun, rerun_inputs, grid_out, api_name="rerun_filter", **search_limits)
        query_class.input(rerun, rerun_inputs, grid_out, api_name="rerun_class", **search_limits)
        wire_facets(demo, page, gallery_choice, filter_box, facets, rerun, rerun_inputs, grid_out,
                    search_limits)  # fmt: skip
        # the next page of the same search (an upload's is embedded again: the embed gate)
        more_button.click(embedding(More(page).more), rerun_inputs, grid_out, api_name="more",
                          **private, **embed_limits)  # fmt: skip
        # a gallery item as the query: the previous upload leaves the query box
        random_button.click(
            searching(page.random_item),
            [gallery_choice, pick_class, k_slider, filter_box, rerank_box],
            [*grid_out, item_id, query_image],
            api_name="random_item",
            **search_limits,
        )
        open_inputs = [gallery_choice, item_id, k_slider, filter_box, rerank_box]
        open_out = [*grid_out, query_image]
        opened = searching(page.opened)
        open_button.click(opened, open_inputs, open_out, api_name="item_grid", **search_limits)
        item_id.submit(opened, open_inputs, open_out, api_name="item_submit", **search_limits)
        results.click(
            searching(page.clicked),
            [gallery_choice, k_slider, filter_box, rerank_box],
            [*grid_out, item_id, query_image],
            api_name="neighbour_clicked",
            **search_limits,
        )

        gallery_outputs = [
            query_class, pick_class, header, results, status, state, filter_box, item_id,
        ]  # fmt: skip
        for trigger in (demo.load, gallery_choice.change):
            trigger(
                page.gallery_changed, gallery_choice, gallery_outputs, **private, queue=False
            ).then(
                page.analysis_outputs,
                gallery_choice,
                analysis_outputs(failures, summary),
                **private,
            ).then(maps.outputs, [gallery_choice, map_parts.method], map_parts.outputs, **private)
        wire_map_tab(map_parts, maps, page, gallery_choice, k_slider, private)
        wire_failures_tab(failures, page, gallery_choice, k_slider, private)

    # api_open=False: Gradio's /run/ routes would run a queued event at once, past the gates;
    # every client joins the queue. Its size bounds what no gate holds (the gated events move
    # on at once: their turn is kept by the gates); a client's share of those is the gates'.
    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue, api_open=False)
    demo.nearsight = page
    demo.nearsight_maps = maps
    if analyse:
        page.start_analysis()
    return demo


def _rerank_info(page: Page) -> str:
    chosen = {page.rerank_on(view).shown for view in page.views.values()}
    return "alpha-QE / DBA / k-reciprocal over the top candidates: " + ", ".join(sorted(chosen))
