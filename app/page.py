"""The Gradio page of `nearsight serve`: query a gallery by image and see its top-k, framed
green (the query's class) or red (another class); inspect the gallery's leave-one-out failures;
read its Recall@k and its pair-distance distributions.

Build with :func:`build_app`, start with :func:`launch_app` (which applies the safety settings:
upload size limit, no file serving beyond Gradio's own upload cache, no analytics, a system-font
theme so that the page fetches nothing from the internet, a queue with a concurrency limit).

Endpoint for gradio_client: ``/search`` (image file, k, gallery name) -> JSON text of the list
of the k nearest items, ``{"id", "path", "label", "class_name", "distance"}``, nearest first::

    neighbours = json.loads(Client(url).predict(handle_file("q.jpg"), api_name="/search"))

The page's own events are callable too but undocumented.

Safety decisions (see also app/page_html.py):

- Gallery images reach the browser only as small JPEG thumbnails inlined into the result HTML,
  made on the server from catalog paths looked up by id. No gallery folder is in Gradio's
  ``allowed_paths``, so ``/gradio_api/file=`` serves nothing but Gradio's upload cache; the
  gallery folders are in ``blocked_paths`` besides. No path from a request is ever opened.
- Uploads larger than ``max_upload_mb`` are refused by Gradio's upload route (HTTP 413); an
  upload that is not an image is answered with a one-line message (gr.Error), never a crash.
"""

from __future__ import annotations

import os

# before gradio is imported: no telemetry, no version check
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import html  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import threading  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402

from nearsight.app.page_data import (  # noqa: E402
    ANALYSIS_MAX_ITEMS,
    GalleryView,
    Neighbour,
    open_views,
    thumbnail_uri,
)
from nearsight.app.page_html import CLICK_JS, QueryCard, message_html, result_html  # noqa: E402
from nearsight.index.images import load_image_bytes  # noqa: E402
from nearsight.models.errors import NearsightError  # noqa: E402

DEFAULT_K = 8
MAX_K = 64
DEFAULT_MAX_UPLOAD_MB = 10.0
DEFAULT_CONCURRENCY = 2  # embedding calls at once (each one uses every core already)
DEFAULT_MAX_QUEUE = 64  # waiting events beyond this are refused ("queue full")
# Sessions whose state Gradio keeps (least recently used dropped first). Every call of the API
# over plain HTTP is a new session holding a copy of every component's config, ~80 KB here:
# Gradio's default of 10000 let a busy API client grow the server by ~0.8 GB.
STATE_SESSIONS = 1000
FAILURE_ROWS = 1000  # rows of the failure table sent to the browser (worst first)
UNKNOWN_CLASS = "-1"
ANY_CLASS = "-1"
FAILURE_COLUMNS = [
    "id",
    "class",
    "top-1 id",
    "top-1 class",
    "top-1 distance",
    "nearest same-class distance",
    "margin",
]
PAIR_COLUMNS = ["class a", "class b", "failures"]
SYSTEM_FONTS = ("system-ui", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


class PageError(NearsightError):
    """Bad input from a page user (shown on the page as a one-line message)."""


def system_theme() -> gr.themes.Base:
    """Gradio's default look with fonts the browser already has (no font download at all)."""
    return gr.themes.Default(
        font=[gr.themes.Font(name) for name in SYSTEM_FONTS],
        font_mono=[gr.themes.Font(name) for name in MONO_FONTS],
    )


def query_image_input(**options: Any) -> gr.Image:
    """gr.Image whose handlers get the uploaded file's path without Gradio decoding it first, so
    that a file that is not an image gets nearsight's one-line message instead of a Pillow
    traceback. (An instance override, not a subclass: Gradio writes a .pyi stub beside the
    module of every Component subclass.)"""
    image = gr.Image(type="filepath", **options)
    decode = image.preprocess

    def preprocess(payload):
        if payload is None:
            return None
        if payload.path and not (payload.url or "").startswith("data:"):
            return str(payload.path)  # Gradio has checked it is in its upload folder
        try:
            return decode(payload)
        except Exception as error:  # a data: URL that does not decode
            raise gr.Error(f"cannot read the pasted image: {error}") from None

    image.preprocess = preprocess  # type: ignore[method-assign]
    return image


class Page:
    """The handlers of the page, over the open galleries."""

    def __init__(self, views: Sequence[GalleryView]):
        if not views:
            raise NearsightError("serve needs at least one gallery")
        self.views = {view.name: view for view in views}
        self.names = [view.name for view in views]
        self._random = random.Random()
        self._warm_thread: threading.Thread | None = None

    # -- helpers -----------------------------------------------------------------------------

    def view(self, name: str | None) -> GalleryView:
        if not name:
            return self.views[self.names[0]]
        try:
            return self.views[name]
        except KeyError:
            known = ", ".join(self.names)
            raise PageError(f"no gallery named {name!r} (this server has: {known})") from None

    @staticmethod
    def check_k(k: Any) -> int:
        try:
            value = int(k)
        except (TypeError, ValueError):
            raise PageError(f"k must be an integer from 1 to {MAX_K}, got {k!r}") from None
        if not 1 <= value <= MAX_K or value != float(k):
            raise PageError(f"k must be an integer from 1 to {MAX_K}, got {k!r}")
        return value

    @staticmethod
    def read_upload(path: str | None) -> tuple[bytes, Any]:
        if not path:
            raise PageError("no query image: upload, paste or drop one")
        file = Path(path)
        try:
            data = file.read_bytes()
        except OSError as error:
            raise PageError(f"cannot read the upload: {error.strerror or error}") from None
        return data, load_image_bytes(data, name=file.name)

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
        for view in self.views.values():
            view.close()

    # -- searching ---------------------------------------------------------------------------

    def api_search(self, image: str | None, k: Any, gallery: str | None) -> str:
        """The /search endpoint: neighbours of an uploaded image, as JSON text (a list of rows).

        Text, not a JSON component: gradio_client (2.x, protocol sse_v3) takes every dict with
        a "path" string in an output for a file to download, and would try to fetch the gallery
        images (which this server refuses to serve)."""
        with _page_errors():
            view = self.view(gallery)
            k = self.check_k(DEFAULT_K if k is None else k)
            _, decoded = self.read_upload(image)
            return json.dumps([n.as_json() for n in view.search_image(decoded, k)])

    def image_changed(self, gallery: str, image_path: str | None, k: Any, query_class):
        """A new query image (uploaded, pasted or dropped); nothing when it was cleared."""
        if not image_path:
            return gr.skip(), gr.skip(), gr.skip()
        return self.upload_grid(gallery, image_path, k, query_class)

    def upload_grid(
        self, gallery: str, image_path: str | None, k: Any, query_class: str | None
    ) -> tuple[str, str, dict]:
        """The grid of an uploaded query; its class from the dropdown, or from an identical
        gallery file when the dropdown says unknown."""
        with _page_errors():
            view = self.view(gallery)
            k = self.check_k(k)
            data, image = self.read_upload(image_path)
            label = _label_value(query_class)
            note = ""
            twin = view.identical_item(data)
            if twin is not None:
                twin_label = view.label_of(twin)
                note = f"identical to gallery item #{twin} ({view.class_name(twin_label)})"
                if label is None:
                    label = twin_label
            neighbours = view.search_image(image, k)
            card = QueryCard(
                title="uploaded image",
                thumbnail=thumbnail_uri(image),
                label=label,
                class_name=view.class_name(label),
                kind="upload",
                note=note,
            )
            return self._render(view, card, neighbours), "", {"kind": "upload"}

    def item_grid(self, gallery: str, item_id: Any, k: Any) -> tuple[str, str, dict]:
        """The leave-one-out grid of a gallery item."""
        with _page_errors():
            view = self.view(gallery)
            k = self.check_k(k)
            item = _item_id(item_id)
            neighbours = view.search_item(item, k)
            label = view.label_of(item)
            card = QueryCard(
                title=f"gallery item #{item}",
                thumbnail=view.thumbnail(item),
                label=label,
                class_name=view.class_name(label),
                kind="item",
                item_id=item,
            )
            return self._render(view, card, neighbours), "", {"kind": "item", "id": item}

    def _render(self, view: GalleryView, card: QueryCard, neighbours: list[Neighbour]) -> str:
        return result_html(
            card,
            neighbours,
            [view.thumbnail(n.id) for n in neighbours],
            [view.class_name(n.label) for n in neighbours],
            gallery=view.name,
            gallery_size=len(view),
        )

    def random_item(self, gallery: str, class_value: str | None, k: Any):
        with _page_errors():
            view = self.view(gallery)
            label = _label_value(class_value)
            if label is None:
                pool = view.labelled_ids if len(view.labelled_ids) else view.ids
            else:
                pool = view.ids[view.labels == label]
            if not len(pool):
                raise PageError(f"gallery {view.name} has no item of that class")
            item = int(pool[self._random.randrange(len(pool))])
        grid, status, state = self.item_grid(gallery, item, k)
        return grid, status, state, item

    def rerun(self, gallery: str, state: dict | None, image_path: str | None, k: Any, query_class):
        """Redraw the current query (after k or the query class changed)."""
        if not state:
            return gr.skip(), gr.skip(), gr.skip()
        if state.get("kind") == "item":
            return self.item_grid(gallery, state["id"], k)
        if not image_path:
            return gr.skip(), gr.skip(), gr.skip()
        return self.upload_grid(gallery, image_path, k, query_class)

    def clicked(self, gallery: str, k: Any, event: gr.EventData):
        """A neighbour was clicked in a grid: query by that item."""
        item = getattr(event, "_data", None) or {}
        if not isinstance(item, dict) or "item_id" not in item:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        grid, status, state = self.item_grid(gallery, item["item_id"], k)
        return grid, status, state, int(item["item_id"])

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
        )

    def analysis_outputs(self, gallery: str):
        """Failure table, confused pairs, their note, the summary and its plot."""
        view = self.view(gallery)
        analysis = view.analysis()
        failures = failure_frame(view, analysis.failures[:FAILURE_ROWS])
        pairs = pd.DataFrame(
            [
                (view.class_name(a), view.class_name(b), count)
                for a, b, count in analysis.confused_pairs
            ],
            columns=PAIR_COLUMNS,
        )
        return (
            failures,
            pairs,
            failure_note(view, len(analysis.failures)),
            message_html("Select a row of the failure table to see its grid."),
            summary_markdown(view),
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


# -- formatting --------------------------------------------------------------------------------


def gallery_header(view: GalleryView) -> str:
    labelled = int((view.labels >= 0).sum())
    return (
        f"**{view.name}**: {len(view)} items ({labelled} labelled), "
        f"{len(view.class_names)} classes, model `{Path(str(view.embedder.path)).name}`"
    )


def summary_markdown(view: GalleryView) -> str:
    meta = view.gallery.meta
    lines = [
        f"### {view.name}",
        f"- folder: `{view.gallery.path}`",
        f"- items: {len(view)} ({int((view.labels >= 0).sum())} labelled), "
        f"classes: {len(view.class_names)}",
        f"- model: `{view.embedder.path}` (sha256 {str(meta.get('model_sha256', ''))[:12]}..), "
        f"dim {meta.get('dim')}, image size {getattr(view.embedder, 'image_size', '?')}",
        f"- index: {meta.get('index_type')}, built {meta.get('created', '?')}",
    ]
    if meta.get("dataset"):
        lines.append(f"- dataset: {meta.get('dataset')}, split: {meta.get('split', '?')}")
    analysis = view.analysis()
    if analysis.error:
        lines.append(f"- leave-one-out evaluation: not available ({analysis.error})")
    else:
        lines.append(
            "- leave-one-out evaluation (the papers' protocol): every labelled item queries "
            "all the others, from the stored embeddings"
        )
        which = "a random sample of" if analysis.pairs_sampled else "all"
        lines.append(
            f"- pair distances below: {which} {analysis.matching_pairs} matching and "
            f"{analysis.non_matching_pairs} non-matching pairs"
        )
    return "\n".join(lines)


def metrics_frame(metrics: dict | None) -> pd.DataFrame:
    if not metrics:
        return pd.DataFrame(columns=["metric", "value"])
    rows = [
        (name, round(float(value), 4) if name != "queries" else int(value))
        for name, value in metrics.items()
    ]
    return pd.DataFrame(rows, columns=["metric", "value"])


def distance_frame(analysis) -> pd.DataFrame:
    if analysis.bin_edges is None:
        return pd.DataFrame(columns=["distance", "density", "pairs"])
    centres = (analysis.bin_edges[:-1] + analysis.bin_edges[1:]) / 2
    frames = [
        pd.DataFrame({"distance": centres, "density": density, "pairs": kind})
        for kind, density in (
            ("matching", analysis.matching_density),
            ("non-matching", analysis.non_matching_density),
        )
    ]
    return pd.concat(frames, ignore_index=True)


def failure_frame(view: GalleryView, failures) -> pd.DataFrame:
    rows = [
        (
            f.id,
            view.class_name(f.label),
            f.top1_id,
            view.class_name(f.top1_label),
            round(f.top1_distance, 4),
            None if f.positive_distance is None else round(f.positive_distance, 4),
            None if f.margin is None else round(f.margin, 4),
        )
        for f in failures
    ]
    return pd.DataFrame(rows, columns=FAILURE_COLUMNS)


def failure_note(view: GalleryView, count: int) -> str:
    analysis = view.analysis()
    if analysis.error:
        return f"No failure list: {analysis.error}."
    shown = f" (the {FAILURE_ROWS} worst shown)" if count > FAILURE_ROWS else ""
    return (
        f"**{count}** of {analysis.labelled} labelled items have a top-1 of another class "
        f"(leave-one-out){shown}. Margin = nearest same-class distance - top-1 distance: the "
        "larger, the worse. Click a column header to sort, a row to see its grid."
    )


def _label_value(value: Any) -> int | None:
    if value is None or str(value) in ("", UNKNOWN_CLASS):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PageError(f"not a class: {value!r}") from None


def _item_id(value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PageError(f"an item id is a whole number, got {value!r}") from None
    if not number.is_integer():
        raise PageError(f"an item id is a whole number, got {value!r}")
    return int(number)


class _page_errors:
    """Turn nearsight's one-line errors into gr.Error (a message on the page, an AppError with
    that message in gradio_client)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, NearsightError):
            # the toast renders HTML: names from uploads must not become markup
            raise gr.Error(html.escape(str(error), quote=False), print_exception=False) from None
        return False


# -- the Blocks --------------------------------------------------------------------------------


def build_app(
    galleries: Sequence[str | os.PathLike[str]] | Sequence[GalleryView],
    model: str | os.PathLike[str] | None = None,
    *,
    device: str = "auto",
    concurrency: int = DEFAULT_CONCURRENCY,
    max_queue: int = DEFAULT_MAX_QUEUE,
    analyse: bool = True,
    analysis_max_items: int = ANALYSIS_MAX_ITEMS,
) -> gr.Blocks:
    """The page over ``galleries`` (folders, or views already open). ``model``: the model that
    embeds uploads (default: each gallery's recorded model; it must match). ``analyse``: start
    the leave-one-out analysis in the background now (otherwise on first use); galleries with
    more than ``analysis_max_items`` labelled items are not analysed. The returned
    Blocks has ``.nearsight`` (the :class:`Page`); start it with :func:`launch_app`."""
    if galleries and isinstance(galleries[0], GalleryView):
        views = list(galleries)  # type: ignore[arg-type]
    else:
        views = open_views(galleries, model, device)  # type: ignore[arg-type]
    for view in views:
        view.analysis_max_items = analysis_max_items
    page = Page(views)
    first = page.names[0]

    with gr.Blocks(title="nearsight", analytics_enabled=False) as demo:
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
                        sources=["upload", "clipboard"],
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
                    search_button = gr.Button("Search", variant="primary", elem_id="ns-search")
                    with gr.Accordion("Query from the gallery (leave-one-out)", open=True):
                        pick_class = gr.Dropdown(
                            label="Class",
                            choices=[("any class", ANY_CLASS)],
                            value=ANY_CLASS,
                            elem_id="ns-pick-class",
                        )
                        random_button = gr.Button("Random gallery image", elem_id="ns-random")
                        item_id = gr.Number(
                            label="Item id", precision=0, value=None, elem_id="ns-item-id"
                        )
                        open_button = gr.Button("Open item", elem_id="ns-open")
                with gr.Column(scale=3):
                    status = gr.Markdown(elem_id="ns-status")
                    results = gr.HTML(
                        message_html("Upload, paste or drop an image, or pick one."),
                        elem_id="ns-results",
                        js_on_load=CLICK_JS,
                    )

            with gr.Tab("Failures", id="failures"):
                failure_info = gr.Markdown("Computing the leave-one-out failures...")
                failure_table = gr.Dataframe(
                    headers=FAILURE_COLUMNS,
                    interactive=False,
                    label="Queries whose top-1 is of another class (leave-one-out)",
                    max_height=360,
                    wrap=True,
                    elem_id="ns-failures",
                )
                all_button = gr.Button("Show all failures", size="sm", elem_id="ns-all-failures")
                failure_results = gr.HTML(
                    message_html("Select a row of the failure table to see its grid."),
                    elem_id="ns-failure-results",
                    js_on_load=None,
                )
                pairs_table = gr.Dataframe(
                    headers=PAIR_COLUMNS,
                    interactive=False,
                    label="Class pairs most often confused (select one to list its failures)",
                    max_height=300,
                    wrap=True,
                    elem_id="ns-pairs",
                )

            with gr.Tab("Summary", id="summary"):
                summary = gr.Markdown("Computing the leave-one-out evaluation...")
                metrics_table = gr.Dataframe(
                    headers=["metric", "value"],
                    interactive=False,
                    label="Recall@k, NMI, MAP@R (leave-one-out, stored embeddings)",
                    elem_id="ns-metrics",
                )
                distance_plot = gr.LinePlot(
                    x="distance",
                    y="density",
                    color="pairs",
                    color_map={"matching": "#16a34a", "non-matching": "#dc2626"},
                    title="Distances of matching vs non-matching pairs (RankMI, Fig. 1)",
                    x_title="Euclidean distance between embeddings",
                    y_title="density",
                    height=320,
                    elem_id="ns-distances",
                )

        # the documented API: image file in, JSON neighbours out (hidden from the page)
        with gr.Row(visible=False):
            api_image = gr.File(label="image", type="filepath")
            api_k = gr.Number(value=DEFAULT_K, precision=0, label="k")
            api_gallery = gr.Textbox(value=first, label="gallery")
            api_result = gr.Textbox(label="neighbours (JSON)")
            api_button = gr.Button("search")

        embed_limits = {"concurrency_id": "embed", "concurrency_limit": concurrency}
        private = {"api_visibility": "undocumented"}
        grid_out = [results, status, state]

        api_button.click(
            page.api_search,
            [api_image, api_k, api_gallery],
            api_result,
            api_name="search",
            api_description="The k nearest gallery items of an image, as JSON text: a list of "
            '{"id", "path", "label", "class_name", "distance"}, nearest first.',
            **embed_limits,
        )
        upload_inputs = [gallery_choice, query_image, k_slider, query_class]
        # change, not upload: a pasted image counts too; clearing the image changes nothing
        query_image.change(
            page.image_changed,
            upload_inputs,
            grid_out,
            api_name="image_changed",
            **private,
            **embed_limits,
        )
        search_button.click(
            page.upload_grid,
            upload_inputs,
            grid_out,
            api_name="search_grid",
            **private,
            **embed_limits,
        )
        rerun_inputs = [gallery_choice, state, query_image, k_slider, query_class]
        k_slider.release(page.rerun, rerun_inputs, grid_out, api_name="rerun_k", **private)
        query_class.input(page.rerun, rerun_inputs, grid_out, api_name="rerun_class", **private)
        random_button.click(
            page.random_item,
            [gallery_choice, pick_class, k_slider],
            [*grid_out, item_id],
            api_name="random_item",
            **private,
        )
        open_inputs = [gallery_choice, item_id, k_slider]
        open_button.click(page.item_grid, open_inputs, grid_out, api_name="item_grid", **private)
        item_id.submit(page.item_grid, open_inputs, grid_out, api_name="item_submit", **private)
        results.click(
            page.clicked,
            [gallery_choice, k_slider],
            [*grid_out, item_id],
            api_name="neighbour_clicked",
            **private,
        )

        gallery_outputs = [query_class, pick_class, header, results, status, state]
        analysis_out = [
            failure_table,
            pairs_table,
            failure_info,
            failure_results,
            summary,
            metrics_table,
            distance_plot,
        ]
        for trigger in (demo.load, gallery_choice.change):
            trigger(
                page.gallery_changed, gallery_choice, gallery_outputs, **private, queue=False
            ).then(page.analysis_outputs, gallery_choice, analysis_out, **private)
        failure_table.select(
            page.failure_selected,
            [gallery_choice, k_slider],
            failure_results,
            api_name="failure_selected",
            **private,
        )
        pairs_table.select(
            page.pair_selected,
            [gallery_choice, k_slider],
            [failure_table, failure_info, failure_results],
            api_name="pair_selected",
            **private,
        )
        all_button.click(
            page.all_failures,
            gallery_choice,
            [failure_table, failure_info],
            api_name="all_failures",
            **private,
        )

    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    demo.nearsight = page  # type: ignore[attr-defined]
    if analyse:
        page.start_analysis()
    return demo


def launch_app(
    demo: gr.Blocks,
    *,
    host: str = "127.0.0.1",
    port: int = 7860,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
) -> str:
    """Start the server with the safety settings; returns the local URL. With
    ``prevent_thread_lock`` it returns at once (call ``demo.close()`` to stop)."""
    page: Page = demo.nearsight  # type: ignore[attr-defined]
    blocked = sorted({str(view.gallery.path) for view in page.views.values()})
    _, url, _ = demo.launch(
        server_name=host,
        server_port=port,
        prevent_thread_lock=prevent_thread_lock,
        quiet=quiet,
        share=False,
        inbrowser=False,
        show_error=False,  # only gr.Error messages reach the page, never a traceback
        max_file_size=int(max_upload_mb * 1024 * 1024),
        allowed_paths=[],
        blocked_paths=blocked,
        enable_monitoring=False,
        ssr_mode=False,
        pwa=False,
        mcp_server=False,
        run_history=False,
        state_session_capacity=STATE_SESSIONS,
        footer_links=["api"],
        theme=system_theme(),
    )
    return url
