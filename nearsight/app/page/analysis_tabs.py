"""The page's two leave-one-out tabs: Failures (the queries whose top-1 is of another class,
the class pairs most confused, what re-ranking fixes and breaks) and Summary (Recall@k, NMI,
MAP@R and the pair-distance distributions). Their contents come from the gallery's analysis
(:meth:`nearsight.app.page.handlers.Page.analysis_outputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from nearsight.app.page.handlers import Page
from nearsight.app.page.html import message_html
from nearsight.app.page.tables import CHANGE_COLUMNS, FAILURE_COLUMNS, FAILURE_TYPES, PAIR_COLUMNS


@dataclass
class FailuresParts:
    """The Failures tab's components (gradio's, typed loosely as gradio types them)."""

    failure_info: Any
    failure_table: Any
    all_button: Any
    failure_results: Any
    changes_button: Any
    changes_info: Any
    changes_table: Any
    pairs_table: Any


@dataclass
class SummaryParts:
    """The Summary tab's components."""

    summary: Any
    metrics_table: Any
    distance_plot: Any


def analysis_outputs(failures: FailuresParts, summary: SummaryParts) -> list[Any]:
    """What :meth:`Page.analysis_outputs` fills, in its order."""
    return [failures.failure_table, failures.pairs_table, failures.failure_info,
            failures.failure_results, summary.summary, summary.metrics_table,
            summary.distance_plot]  # fmt: skip


def failures_tab_layout() -> FailuresParts:
    """The Failures tab (inside ``gr.Tabs``)."""
    with gr.Tab("Failures", id="failures"):
        failure_info = gr.Markdown("Computing the leave-one-out failures...")
        failure_table = gr.Dataframe(
            headers=FAILURE_COLUMNS,
            datatype=FAILURE_TYPES,
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
        with gr.Accordion("What re-ranking changes", open=False):
            changes_button = gr.Button(
                "List the queries re-ranking fixes and breaks",
                size="sm",
                elem_id="ns-rerank-changes",
            )
            changes_info = gr.Markdown(elem_id="ns-changes-info")
            changes_table = gr.Dataframe(
                headers=CHANGE_COLUMNS,
                interactive=False,
                max_height=300,
                wrap=True,
                elem_id="ns-changes",
            )
        pairs_table = gr.Dataframe(
            headers=PAIR_COLUMNS,
            interactive=False,
            label="Class pairs most often confused (select one to list its failures)",
            max_height=300,
            wrap=True,
            elem_id="ns-pairs",
        )
    return FailuresParts(failure_info, failure_table, all_button, failure_results,
                         changes_button, changes_info, changes_table, pairs_table)  # fmt: skip


def summary_tab_layout() -> SummaryParts:
    """The Summary tab (inside ``gr.Tabs``)."""
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
    return SummaryParts(summary, metrics_table, distance_plot)


def wire_failures_tab(
    parts: FailuresParts, page: Page, gallery_choice: Any, k_slider: Any, private: dict[str, Any]
) -> None:
    """The Failures tab's events: a failure's grid, a pair's failures, re-ranking's changes,
    every failure."""
    parts.failure_table.select(
        page.failure_selected,
        [gallery_choice, k_slider],
        parts.failure_results,
        api_name="failure_selected",
        **private,
    )
    parts.pairs_table.select(
        page.pair_selected,
        [gallery_choice, k_slider],
        [parts.failure_table, parts.failure_info, parts.failure_results],
        api_name="pair_selected",
        **private,
    )
    parts.changes_button.click(
        page.rerank_changes,
        gallery_choice,
        [parts.changes_table, parts.changes_info],
        api_name="rerank_changes",
        **private,
    )
    parts.all_button.click(
        page.all_failures,
        gallery_choice,
        [parts.failure_table, parts.failure_info],
        api_name="all_failures",
        **private,
    )
