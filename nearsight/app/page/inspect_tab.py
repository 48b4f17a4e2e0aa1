"""The page's Inspect tab, over nearsight/search/inspect/: the gallery compared with another
one of the same items (the queries it fixed and broke; one query's two grids side by side),
its suspected wrong labels (select one to see its grid), and its failures exported as a CSV
file or the self-contained HTML report. Built and wired by :func:`inspect_tab` inside the
page's ``gr.Tabs``."""

from __future__ import annotations

import re
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from nearsight.app.page.html import message_html
from nearsight.app.page.inputs import PageError, page_errors
from nearsight.app.page.tables import ColumnType

if TYPE_CHECKING:
    import pandas as pd

    from nearsight.app.page.handlers import Page
    from nearsight.search.inspect.compare import Comparison

COMPARE_COLUMNS = ["id", "image", "key", "class", "verdict", "top-1 class", "baseline top-1 class"]
COMPARE_TYPES: list[ColumnType] = ["number", "markdown", "str", "str", "str", "str", "str"]
LABEL_COLUMNS = ["rank", "id", "image", "key", "class", "suggested class", "label quality"]
LABEL_TYPES: list[ColumnType] = ["number", "number", "markdown", "str", "str", "str", "number"]
THUMBNAIL_PX = 56
TABLE_ROWS = 200  # rows sent to the browser


class InspectTab:
    """The tab's handlers; comparisons and label rankings are computed once per gallery pair
    (or gallery) and kept."""

    def __init__(self, page: Page) -> None:
        self.page = page
        # the latest result per gallery (pair), with the generations it was computed on: a
        # reloaded gallery is computed again, and the old result dropped
        self._comparisons: dict[tuple[str, str], tuple[tuple[int, int], Comparison]] = {}
        self._labels: dict[str, tuple[int, pd.DataFrame]] = {}
        self._lock = threading.Lock()
        self._exports = Path(tempfile.mkdtemp(prefix="nearsight-exports-"))  # Gradio copies them

    def export(self, gallery: str, kind: str) -> str:
        """The gallery's failures as a CSV file or the HTML report: the file's path, which
        Gradio copies into its own cache and offers for download."""
        from nearsight.search.inspect.failures import inspect_failures
        from nearsight.search.inspect.report import write_report

        view = self.page.view(gallery)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", gallery)
        with page_errors():
            if kind == "csv":
                out = self._exports / f"{name}-failures.csv"
                inspect_failures(view.gallery).failures.to_csv(out, index=False)
            else:
                out = self._exports / f"{name}-report.html"
                write_report(view.gallery, out)
        return str(out)

    def _image(self, gallery: str, item_id: int | None) -> str:
        if item_id is None:
            return ""
        uri = self.page.view(gallery).thumbnail(int(item_id))
        return f'<img src="{uri}" alt="#{item_id}" height="{THUMBNAIL_PX}">' if uri else ""

    def comparison(self, gallery: str, against: str) -> Comparison:
        from nearsight.search.inspect.compare import compare_galleries

        first, second = self.page.view(gallery), self.page.view(against)
        generations = (first.generation, second.generation)
        with self._lock:
            kept = self._comparisons.get((gallery, against))
            if kept is None or kept[0] != generations:
                kept = (generations, compare_galleries(first.gallery, second.gallery))
                self._comparisons[(gallery, against)] = kept
            return kept[1]

    def compare(self, gallery: str, against: str | None):
        """The queries --gallery fixed and broke against the baseline, and the numbers."""
        import pandas as pd

        with page_errors():
            if not against or against == gallery:
                raise PageError("choose another gallery of the same items as the baseline")
            result = self.comparison(gallery, against)
        changed = result.items[result.items["verdict"].isin(["fixed", "broken"])]
        changed = changed.sort_values("verdict", kind="stable", key=lambda v: v != "fixed")
        rows = [
            (
                row["id"],
                self._image(gallery, row["id"]),
                row["key"] or "",
                row["class"],
                row["verdict"],
                row["top1_class"],
                row["baseline_top1_class"],
            )  # fmt: skip
            for row in changed.head(TABLE_ROWS).to_dict("records")
        ]
        low, high = result.interval
        counts = result.counts
        note = (
            f"**{result.queries}** queries (items matched by {result.matched_by}): Recall@1 "
            f"**{result.recall_gallery:.4f}** here vs {result.recall_baseline:.4f} in "
            f"**{against}**, difference {result.delta:+.4f} (95% paired bootstrap interval "
            f"{low:+.4f} to {high:+.4f}). Fixed **{counts['fixed']}**, broken "
            f"**{counts['broken']}**, wrong in both {counts['wrong in both']}. Select a row "
            "to see its grid in both galleries."
        )
        return pd.DataFrame(rows, columns=COMPARE_COLUMNS), note

    def compare_selected(self, gallery: str, against: str, k: Any, event: gr.SelectData):
        """One query's grid in each gallery, side by side."""
        row = event.row_value
        if not row or not against:
            return gr.skip(), gr.skip()
        with page_errors():
            items = self.comparison(gallery, against).items
            match = items[items["id"] == int(row[0])]
            if match.empty:
                raise PageError(f"item {row[0]} is not among the compared items")
            other = int(match.iloc[0]["baseline_id"])
        return (
            self.page.item_grid(gallery, int(row[0]), k)[0],
            self.page.item_grid(against, other, k)[0],
        )

    def explain(self, gallery: str, first: Any, second: Any):
        """Where the similarity of two gallery items comes from (needs torch: [train])."""
        from nearsight.core.extras import missing_extra

        with page_errors():
            ids = []
            for value in (first, second):
                try:
                    ids.append(int(value))
                except (TypeError, ValueError):
                    raise PageError(f"an item id is a whole number, got {value!r}") from None
            try:
                from nearsight.search.inspect.explain import explain_pair, picture

                explanation = explain_pair(self.page.view(gallery).gallery, ids[0], ids[1])
            except ModuleNotFoundError as error:
                line = missing_extra(error)
                if line is None:
                    raise
                raise PageError(f"why a match: {line}") from None
        maps = explanation.maps
        note = (
            f"Similarity **{maps.similarity:.4f}**; the shares of the {maps.map_a.size} "
            f"locations of each feature map sum to {maps.map_a.sum():.4f} and "
            f"{maps.map_b.sum():.4f} (red adds to it, blue takes from it)."
        )
        return picture(explanation), note

    def labels(self, gallery: str):
        """The suspected labels of the gallery, most suspicious first."""
        import pandas as pd

        from nearsight.search.inspect.labels import suspected_labels

        view = self.page.view(gallery)
        with page_errors():
            with self._lock:
                kept = self._labels.get(gallery)
                if kept is None or kept[0] != view.generation:
                    kept = (view.generation, suspected_labels(view.gallery, top=TABLE_ROWS))
                    self._labels[gallery] = kept
            found = kept[1]
        rows = [
            (
                row["rank"],
                row["id"],
                self._image(gallery, row["id"]),
                row["key"] or "",
                row["class"],
                row["suggested class"],
                row["label quality"],
            )  # fmt: skip
            for row in found.to_dict("records")
        ]
        note = (
            f"**{len(rows)}** items whose neighbours suggest another class, most suspicious "
            "first (confident learning, cleanlab, on the 50 nearest neighbours' labels). "
            "Select a row to see its grid."
        )
        return pd.DataFrame(rows, columns=LABEL_COLUMNS), note

    def label_selected(self, gallery: str, k: Any, event: gr.SelectData):
        row = event.row_value
        if not row:
            return gr.skip()
        return self.page.item_grid(gallery, int(row[1]), k)[0]


def inspect_tab(page: Page, gallery_choice: Any, k_slider: Any) -> InspectTab:
    """The Inspect tab (inside ``gr.Tabs``), its events wired (undocumented API names, as the
    page's other events)."""
    private: dict[str, Any] = {"api_visibility": "undocumented"}
    tab = InspectTab(page)
    names = page.names
    baseline = names[1] if len(names) > 1 else None  # the demo: trained, then untrained
    with gr.Tab("Inspect", id="inspect"):
        with gr.Accordion("Compare with another gallery of the same items", open=True):
            with gr.Row():
                against = gr.Dropdown(
                    choices=names, value=baseline, label="Baseline gallery",
                    elem_id="ns-compare-against",
                )  # fmt: skip
                compare_button = gr.Button("Compare", elem_id="ns-compare")
            compare_info = gr.Markdown(elem_id="ns-compare-info")
            compare_table = gr.Dataframe(
                headers=COMPARE_COLUMNS, datatype=COMPARE_TYPES,
                interactive=False, max_height=320, wrap=True, elem_id="ns-compare-table",
            )  # fmt: skip
            with gr.Row():
                grid = gr.HTML(elem_id="ns-compare-grid")
                grid_against = gr.HTML(elem_id="ns-compare-grid-against")
        with gr.Accordion("Suspected labels", open=True):
            labels_button = gr.Button("Find suspected labels", elem_id="ns-labels")
            labels_info = gr.Markdown(elem_id="ns-labels-info")
            labels_table = gr.Dataframe(
                headers=LABEL_COLUMNS,
                datatype=LABEL_TYPES,
                interactive=False, max_height=320, wrap=True, elem_id="ns-labels-table",
            )  # fmt: skip
            labels_grid = gr.HTML(message_html("Select a row to see its grid."))
        with gr.Accordion("Why a match", open=False):
            with gr.Row():
                first_id = gr.Number(label="Item id", precision=0, elem_id="ns-explain-a")
                second_id = gr.Number(label="Other item id", precision=0, elem_id="ns-explain-b")
                explain_button = gr.Button("Explain", elem_id="ns-explain")
            explain_note = gr.Markdown(elem_id="ns-explain-note")
            explain_image = gr.Image(
                type="pil", format="png", interactive=False, buttons=[], elem_id="ns-explain-map"
            )
        with gr.Accordion("Export the failures", open=True):
            with gr.Row():
                csv_button = gr.Button("Failures (CSV)", elem_id="ns-export-csv")
                report_button = gr.Button("Report (one HTML file)", elem_id="ns-export-report")
            exported = gr.File(label="Download", interactive=False, elem_id="ns-export-file")
    compare_button.click(tab.compare, [gallery_choice, against], [compare_table, compare_info],
                         api_name="compare", **private)  # fmt: skip
    compare_table.select(tab.compare_selected, [gallery_choice, against, k_slider],
                         [grid, grid_against], api_name="compare_selected", **private)  # fmt: skip
    labels_button.click(tab.labels, gallery_choice, [labels_table, labels_info],
                        api_name="labels", **private)  # fmt: skip
    labels_table.select(tab.label_selected, [gallery_choice, k_slider], labels_grid,
                        api_name="label_selected", **private)  # fmt: skip
    explain_button.click(tab.explain, [gallery_choice, first_id, second_id],
                         [explain_image, explain_note], api_name="explain", **private)  # fmt: skip
    csv_button.click(lambda gallery: tab.export(gallery, "csv"), gallery_choice, exported,
                     api_name="export_csv", **private)  # fmt: skip
    report_button.click(lambda gallery: tab.export(gallery, "html"), gallery_choice, exported,
                        api_name="export_report", **private)  # fmt: skip
    return tab
