"""One self-contained HTML file of a gallery's leave-one-out picture: Recall@k, the worst
classes, the confused pairs and each failure with its grid. Thumbnails are inline JPEG data
URIs and the style sheet is inline; the file makes no request to any host, so it opens
offline and can be mailed as it is."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.atomic import atomic_file
from nearsight.core.errors import NearsightError
from nearsight.data.images import load_image
from nearsight.index.gallery.summary import gallery_summary
from nearsight.search.inspect.failures import FailureReport, inspect_failures
from nearsight.search.inspect.items import GalleryLike, Items, opened
from nearsight.search.verdicts import FRAME_COLOURS, QUERY_COLOUR, correctness, thumbnail_uri

if TYPE_CHECKING:
    import pandas as pd

    from nearsight.index.gallery.core import Gallery

GRID_K = 8  # neighbours in each failure's grid
REPORT_FAILURES = 50  # failures drawn with their grids (the table lists every one)
REPORT_CLASSES = 15  # worst classes listed
REPORT_PAIRS = 20  # confused pairs listed
THUMB_SIDE = 96

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1f2937}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d1d5db;padding:3px 8px;
font-size:13px;text-align:left}th{background:#f3f4f6}
.grid{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0 18px}
.cell{border:4px solid;border-radius:6px;padding:3px;width:96px;font-size:11px;
overflow-wrap:anywhere}.cell img{display:block;width:96px;height:96px;object-fit:contain}
.missing{width:96px;height:96px;background:#e5e7eb;display:flex;align-items:center;
justify-content:center}
"""


class Thumbnails:
    """Data URIs of items' images, each made once; None where the file cannot be read."""

    def __init__(self, items: Items, side: int = THUMB_SIDE) -> None:
        self.items, self.side = items, side
        self._row = {int(item_id): row for row, item_id in enumerate(items.ids)}
        self._made: dict[int, str | None] = {}

    def __call__(self, item_id: int) -> str | None:
        if item_id not in self._made:
            try:
                image = load_image(self.items.paths[self._row[item_id]], self.side)
                self._made[item_id] = thumbnail_uri(image, self.side)
            except (NearsightError, OSError, KeyError):
                self._made[item_id] = None
        return self._made[item_id]


def write_report(
    gallery: GalleryLike,
    out: str | os.PathLike[str],
    *,
    k: int = GRID_K,
    max_failures: int = REPORT_FAILURES,
) -> FailureReport:
    """Write the report of ``gallery`` to ``out`` (one HTML file); returns its tables."""
    with opened(gallery) as open_gallery:
        report = inspect_failures(open_gallery)
        grids = _failure_grids(open_gallery, report, k, max_failures)
        facts = gallery_summary(open_gallery)
        name = open_gallery.path.name
    thumbs = Thumbnails(report.items)
    page = render(name, facts, report, grids, thumbs)
    with atomic_file(out, "w") as handle:
        handle.write(page)
    return report


def _failure_grids(
    gallery: Gallery, report: FailureReport, k: int, limit: int
) -> list[tuple[int, list[tuple[int, float]]]]:
    """(query id, [(neighbour id, distance)...]) of the worst ``limit`` failures, each query
    left out of its own results."""
    chosen = [f.id for f in report.failure_list[:limit]]
    if not chosen:
        return []
    vectors = gallery.vectors_of(chosen)
    distances, found = gallery.search(vectors, k, exclude=chosen)
    return [
        (query, [(int(i), float(d)) for i, d in zip(ids, dists, strict=True) if i >= 0])
        for query, ids, dists in zip(chosen, found, distances, strict=True)
    ]


def render(
    name: str,
    facts: dict[str, Any],
    report: FailureReport,
    grids: Sequence[tuple[int, list[tuple[int, float]]]],
    thumbs: Thumbnails,
) -> str:
    e = html.escape
    items = report.items
    row_of = {int(item_id): row for row, item_id in enumerate(items.ids)}
    labelled = facts["labelled"]
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>nearsight report: {e(name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Leave-one-out report of {e(name)}</h1>",
        f"<p>{facts['items']} items ({labelled} labelled), {facts['classes']} classes, model "
        f"<code>{e(str(facts['model']))}</code>. Every labelled item queries all the others; "
        f"a failure is a query whose top-1 is of another class: "
        f"<b>{len(report.failure_list)}</b> of {labelled}.</p>",
        "<h2>Recall@k</h2>",
        _table(["metric", "value"], [(m, _number(v)) for m, v in report.metrics.items()]),
        "<h2>Worst classes</h2>",
        _frame_table(report.classes.head(REPORT_CLASSES)),
        "<h2>Class pairs most often confused</h2>",
        _frame_table(report.pairs.head(REPORT_PAIRS)),
        f"<h2>Failures with their grids (the {len(grids)} worst)</h2>",
        "<p>Green frame: the query's class; red: another class. Margin = nearest same-class "
        "distance - top-1 distance.</p>",
    ]
    for query, neighbours in grids:
        row = row_of[query]
        label = int(items.labels[row])
        cells = [
            _cell(thumbs(query), QUERY_COLOUR, "query", _name(items, row), items.class_name(label))
        ]
        for rank, (neighbour, dist) in enumerate(neighbours, start=1):
            other = row_of.get(neighbour, -1)
            other_label = int(items.labels[other]) if other >= 0 else -1
            colour = FRAME_COLOURS[correctness(label, other_label)]
            caption = f"{rank}. d={dist:.3f}"
            cells.append(
                _cell(
                    thumbs(neighbour),
                    colour,
                    caption,
                    _name(items, other),
                    items.class_name(other_label),
                )  # fmt: skip
            )
        parts.append(f'<div class=grid data-query="{query}">{"".join(cells)}</div>')
    parts += ["<h2>Every failure</h2>", _frame_table(report.failures), "</body></html>"]
    return "\n".join(parts)


def _name(items: Items, row: int) -> str:
    if row < 0:
        return "?"
    key = items.keys[row]
    return (
        f"key {key}" if key is not None else f"#{int(items.ids[row])} {Path(items.paths[row]).name}"
    )


def _cell(uri: str | None, colour: str, caption: str, name: str, class_name: str | None) -> str:
    e = html.escape
    image = (
        f'<img src="{e(uri, quote=True)}" alt="{e(name)}">'
        if uri
        else "<div class=missing>unreadable</div>"
    )
    return (
        f'<div class=cell style="border-color:{colour}">{image}<b>{e(caption)}</b><br>'
        f"{e(name)}<br>{e(class_name or 'unlabelled')}</div>"
    )


def _number(value: object) -> str:
    if isinstance(value, float | np.floating):
        return f"{float(value):.4f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(_number(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _frame_table(frame: pd.DataFrame) -> str:
    return _table(list(frame.columns), [tuple(row) for row in frame.itertuples(index=False)])
