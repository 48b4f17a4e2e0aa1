"""HTML of the page's result grids (for gr.HTML), with inline styles and data attributes.

Every cell carries ``data-rank``, ``data-id``, ``data-label`` and ``data-correct`` ("true",
"false" or "unknown"), so that scripts and browser tests need not parse text. The frame colour
says the same as ``data-correct``: green when the neighbour's class is the query's, red when it
is not, grey when the query's class is unknown (or the neighbour is unlabelled). Images are
inline JPEG data URIs made from the gallery files on the server: the browser never asks the
server for a file by its path. All text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nearsight.app.page.products import ProductHit
from nearsight.search.served import Neighbour
from nearsight.search.verdicts import FRAME_COLOURS, QUERY_COLOUR, correctness

CELL_SIDE = 152  # pixels of the image area of a cell
META_SHOWN = 4  # metadata fields on a card (the key first; the rest on hover)
TITLE_COLUMNS = ("title", "name")  # a card's title, where the gallery has such a column
META_VALUE_CHARS = 24
_CELL_STYLE = (
    "margin:0;padding:4px;border:4px solid {colour};border-radius:8px;box-sizing:content-box;"
    "width:{side}px;cursor:pointer;background:rgba(127,127,127,0.06)"
)
_IMAGE_STYLE = "display:block;width:{side}px;height:{side}px;object-fit:contain"
_MISSING_STYLE = (
    "display:flex;align-items:center;justify-content:center;width:{side}px;height:{side}px;"
    "font-size:12px;opacity:0.7;background:rgba(127,127,127,0.15)"
)
_CAPTION_STYLE = "font-size:12px;line-height:1.35;margin-top:4px;overflow-wrap:anywhere"


@dataclass
class QueryCard:
    """The query beside the grid."""

    title: str  # "uploaded image" or "gallery item #12"
    thumbnail: str | None  # data URI
    label: int | None  # the known class, or None
    class_name: str  # shown class ("unknown" when None)
    kind: str  # "upload" or "item"
    item_id: int | None = None
    note: str = ""  # e.g. "identical to gallery item #3"
    key: str | None = None  # the item's key, when the query is a keyed gallery item


def _image(uri: str | None, alt: str) -> str:
    if uri is None:
        return f'<div style="{_MISSING_STYLE.format(side=CELL_SIDE)}">image not readable</div>'
    style = _IMAGE_STYLE.format(side=CELL_SIDE)
    return f'<img src="{html.escape(uri, quote=True)}" alt="{html.escape(alt)}" style="{style}">'


def result_html(
    query: QueryCard,
    neighbours: Sequence[Neighbour],
    thumbnails: Sequence[str | None],
    class_names: Sequence[str],
    *,
    gallery: str,
    gallery_size: int,
    matching: int | None = None,
    lead_fields: Sequence[str] = (),
    filtered_fields: Sequence[str] = (),
    title_fields: Sequence[str] = (),
) -> str:
    """The query card and its top-k grid. ``matching``: how many items the filter allows (None:
    no filter). Each card leads with ``lead_fields`` (the key column, or the fields the
    operator chose: ``serve --card-fields``), then a title (the first of ``title_fields``,
    :func:`title_columns`, that the search did not filter on), then ``filtered_fields`` (what
    the search filtered on), then as many others as fit :data:`META_SHOWN`, then the rank,
    class and distance; every field is in the card's tooltip and its "all fields" list. A
    tag column's value (a list of tags) shows as ``[a, b]``. A
    product's card (a :class:`~nearsight.app.page.products.ProductHit`: a grid grouped by the
    gallery's group column) shows its best photo and how many photos the product has."""
    e = html.escape
    verdicts = [correctness(query.label, n.label) for n in neighbours]
    right = verdicts.count("true")
    searched = (
        f"{gallery_size} items in {e(gallery)}"
        if matching is None
        else f"{matching} matching items (of {gallery_size}) in {e(gallery)}"
    )
    grouped = bool(neighbours) and all(isinstance(n, ProductHit) for n in neighbours)
    unit = " products" if grouped else ""
    summary = f"{len(neighbours)} nearest{unit} of {searched}"
    if query.label is not None:
        summary += f": {right} of the query's class"
    if query.kind == "item":
        summary += " (the query itself left out)"

    query_style = _CELL_STYLE.format(colour=QUERY_COLOUR, side=CELL_SIDE) + ";cursor:default"
    note = f"<br><em>{e(query.note)}</em>" if query.note else ""
    query_id = f' data-id="{query.item_id}"' if query.item_id is not None else ""
    query_label = "" if query.label is None else str(query.label)
    query_key = (
        "" if query.key is None else f'<br>key: <strong class="ns-key">{e(query.key)}</strong>'
    )
    parts = [
        f'<div class="ns-result" data-gallery="{e(gallery)}" data-query-kind="{query.kind}"'
        f'{query_id} data-query-label="{query_label}" data-k="{len(neighbours)}"'
        ' style="display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap">',
        f'<figure class="ns-query" data-role="query" style="{query_style}">',
        _image(query.thumbnail, "query"),
        f'<figcaption style="{_CAPTION_STYLE}"><strong>Query</strong>: {e(query.title)}<br>'
        f'class: <span class="ns-class">{e(query.class_name)}</span>{query_key}{note}'
        "</figcaption>",
        "</figure>",
        '<div style="flex:1;min-width:200px">',
        f'<div class="ns-summary" style="font-size:13px;margin-bottom:8px">{summary}</div>',
        '<div class="ns-grid" style="display:flex;flex-wrap:wrap;gap:10px">',
    ]
    for neighbour, verdict, uri, name in zip(
        neighbours, verdicts, thumbnails, class_names, strict=True
    ):
        distance = "n/a" if neighbour.distance is None else f"{neighbour.distance:.4f}"
        label = "" if neighbour.label is None else str(neighbour.label)
        style = _CELL_STYLE.format(colour=FRAME_COLOURS[verdict], side=CELL_SIDE)
        meta = shown_meta(neighbour.meta or {})
        title = "\n".join(
            [f"id {neighbour.id}: {neighbour.path}", *(f"{k}={v}" for k, v in meta.items())]
        )
        product = count = ""
        if isinstance(neighbour, ProductHit):
            photos = neighbour.photos
            product = f' data-photos="{photos}" data-group="{e(str(neighbour.group), quote=True)}"'
            plural = "" if photos == 1 else "s"
            count = f'<span class="ns-photos">{photos} photo{plural}</span><br>'
        key = "" if neighbour.key is None else f' data-key="{e(neighbour.key, quote=True)}"'
        parts += [
            f'<figure class="ns-cell" data-rank="{neighbour.rank}" data-id="{neighbour.id}"'
            f'{key}{product} data-label="{label}" data-correct="{verdict}"'
            f' data-distance="{distance}"'
            f' title="{e(title, quote=True)}" style="{style}">',
            _image(uri, f"rank {neighbour.rank}"),
            f'<figcaption style="{_CAPTION_STYLE}">'
            f"{_meta_lines(meta, lead_fields, filtered_fields, title_fields)}{count}"
            f'<strong>#{neighbour.rank}</strong> <span class="ns-class">{e(name)}</span><br>'
            f'distance <span class="ns-distance">{distance}</span> · id {neighbour.id}'
            f"{_all_fields(meta)}</figcaption>",
            "</figure>",
        ]
    parts += ["</div>", "</div>", "</div>"]
    return "".join(parts)


def title_columns(column_types: Mapping[str, str]) -> list[str]:
    """The columns a card's title may come from, best first: one named ``title`` or ``name``,
    else the text columns (type ``str``) in the order given."""
    named = [column for column in TITLE_COLUMNS if column in column_types]
    return named or [column for column, kind in column_types.items() if kind == "str"]


def card_fields(
    meta: dict,
    lead: Sequence[str] = (),
    filtered: Sequence[str] = (),
    room: int = META_SHOWN,
    titles: Sequence[str] = (),
) -> list[str]:
    """The metadata fields a card shows, in order: ``lead`` (the key first), then a title
    (the first of ``titles`` the item holds that is neither a lead field nor filtered on),
    then the fields the search ``filtered`` on, then the others by name, as many as ``room``
    holds (the lead, title and filtered fields always show)."""
    title = [t for t in titles if meta.get(t) not in (None, "")
             and t not in lead and t not in filtered][:1]  # fmt: skip
    chosen = [f for f in dict.fromkeys([*lead, *title, *filtered]) if f in meta]
    others = [f for f in sorted(meta) if f not in chosen]
    return chosen + others[: max(0, room - len(chosen))]


def shown_meta(meta: Mapping[str, object]) -> dict:
    """An item's fields as a card shows them: a tag column's list of tags as ``[a, b]``."""
    return {
        name: f"[{', '.join(map(str, value))}]" if isinstance(value, list) else value
        for name, value in meta.items()
    }


def _short_value(value: object) -> str:
    text = str(value)
    return text if len(text) <= META_VALUE_CHARS else text[: META_VALUE_CHARS - 1] + "…"


def _meta_lines(
    meta: dict, lead: Sequence[str], filtered: Sequence[str], titles: Sequence[str]
) -> str:
    """The item's fields at the head of its caption (:func:`card_fields`): the key in bold,
    the title, the filtered fields, the others."""
    if not meta:
        return ""
    e = html.escape
    shown = card_fields(meta, lead, filtered, titles=titles)
    spans = []
    for field in shown:
        kind = "ns-key" if lead and field == lead[0] else "ns-field"
        weight = "font-weight:600;" if kind == "ns-key" else ""
        spans.append(
            f'<span class="{kind}" data-field="{e(field, quote=True)}" style="{weight}">'
            f"{e(field)}={e(_short_value(meta[field]))}</span>"
        )
    return f'<span class="ns-meta" style="opacity:0.85">{"<br>".join(spans)}</span><br>'


def _all_fields(meta: dict) -> str:
    """Every field of the item in an "all N fields" list one click away."""
    if not meta:
        return ""
    e = html.escape
    rows = "".join(
        f'<div data-field="{e(k, quote=True)}">{e(k)}={e(str(v))}</div>' for k, v in meta.items()
    )
    return (
        f'<details class="ns-all-fields"><summary>all {len(meta)} fields</summary>{rows}</details>'
    )


def message_html(text: str) -> str:
    """A plain note in place of a grid (nothing searched yet, an empty failure list...)."""
    return f'<div class="ns-message" style="padding:12px;opacity:0.8">{html.escape(text)}</div>'


# Clicking a neighbour asks the server for that item's leave-one-out grid (gr.HTML's
# js_on_load: ``trigger`` sends the event with this data to the Python listener).
CLICK_JS = """
element.addEventListener('click', (event) => {
  if (event.target.closest('.ns-all-fields')) { return; }  // opens the field list only
  const cell = event.target.closest('.ns-cell');
  if (cell && cell.dataset.id) { trigger('click', {item_id: Number(cell.dataset.id)}); }
});
"""
