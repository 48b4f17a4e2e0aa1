"""The facets beside the page's filter box: the most frequent values of each text and tag column
among the items the filter allows, with their counts (nearsight/search/facets.py, as REST's
``/api/facets``); picking one adds its filter to the box and searches again."""

from __future__ import annotations

from typing import Any

import gradio as gr

from nearsight.core.errors import NearsightError
from nearsight.search.facets import gallery_facets

TOP = 5  # values offered per column


def facet_choices(page: Any, gallery: str | None, filter_text: str | None) -> list[tuple[str, str]]:
    """(label, filter) per value: ``shop: Café (12)`` -> ``shop=Café``; none for a filter
    that cannot be applied (the search says why)."""
    try:
        view = page.view(gallery)
        found = gallery_facets(
            view.gallery, filter_text or None, TOP, 1, page.max_filter_conditions
        )
    except NearsightError:  # a bad filter (a PageError too): the search's message says why
        return []
    choices = []
    for column in found.columns:
        for value, count in column.values:
            if ";" in value or "\n" in value:  # the box's separators: not sayable there
                continue
            shown = value.replace("|", "\\|")
            choices.append((f"{column.key}: {value} ({count})", f"{column.key}={shown}"))
    return choices


def facets_update(page: Any, gallery: str | None, filter_text: str | None) -> Any:
    choices = facet_choices(page, gallery, filter_text)
    return gr.update(choices=choices, value=None, visible=bool(choices))


def with_facet(filter_text: str | None, picked: str | None) -> str:
    """The filter box with ``picked`` added (once)."""
    text = (filter_text or "").strip().rstrip(";").strip()
    if not picked:
        return text
    parts = [part.strip() for part in text.split(";") if part.strip()]
    if picked not in parts:
        parts.append(picked)
    return "; ".join(parts)


def facet_dropdown() -> Any:
    return gr.Dropdown(
        label="Facets of the matching items (pick one to add its filter)",
        choices=[],
        value=None,
        visible=False,
        elem_id="ns-facets",
    )


def wire_facets(
    demo: Any,
    page: Any,
    gallery_choice: Any,
    filter_box: Any,
    facets: Any,
    rerun: Any,
    rerun_inputs: list,
    grid_out: list,
    private: dict,
) -> None:
    """Facets follow the gallery and the filter; a pick adds its filter and searches again."""

    def update(gallery: str | None, filter_text: str | None) -> Any:
        return facets_update(page, gallery, filter_text)

    for trigger in (demo.load, gallery_choice.change, filter_box.submit):
        trigger(update, [gallery_choice, filter_box], facets, **private)
    facets.input(with_facet, [filter_box, facets], filter_box, **private).then(
        rerun, rerun_inputs, grid_out, **private
    ).then(update, [gallery_choice, filter_box], facets, **private)
