"""What a page user sends, checked, and nearsight's errors as the page shows them."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import gradio as gr

from nearsight.app.page.html import QueryCard, message_html
from nearsight.app.page.view import GalleryView
from nearsight.core.errors import NearsightError
from nearsight.index.catalog.list_columns import gallery_list_columns
from nearsight.search.rerank.spec import NONE, RerankSpec, parse_rerank

UNKNOWN_CLASS = "-1"
# the page's re-rank toggle where neither serve --rerank nor the gallery chose one
PAGE_RERANK = "dba+aqe:k=5,alpha=3"  # chosen on validation classes in bench/rerank.py


class PageError(NearsightError):
    """Bad input from a page user (shown on the page as a one-line message)."""


def code_span(text: str) -> str:
    """``text`` as a markdown code span, shown exactly as typed (markdown escapes what is
    inside; escaping it here too showed ``price&lt;20``)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def filter_note(filters: str | None, notes: Sequence[str] = ()) -> str:
    """The status line under the grid while a filter is on, with its notes (a value no item
    holds, and the closest ones held)."""
    text = " ".join((filters or "").split())
    if not text:
        return ""
    lines = [f"Filtered: only items with {code_span(text)}"]
    lines += [f"**Note**: {code_span(note)}" for note in notes]
    return "  \n".join(lines)


def filter_error(error: Exception) -> str:
    """The status line of a filter that could not be applied."""
    return f"**Filter not applied**: {code_span(str(error))}"


def item_value(value: Any) -> int | str:
    """The item box: a whole number is an id; other text is a key (the gallery decides)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return item_id_value(value)
    text = str(value or "").strip()
    if not text:
        raise PageError("no item: type an item id or key")
    return text


def label_value(value: Any) -> int | None:
    if value is None or str(value) in ("", UNKNOWN_CLASS):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PageError(f"not a class: {value!r}") from None


def item_id_value(value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PageError(f"an item id is a whole number, got {value!r}") from None
    if not number.is_integer():
        raise PageError(f"an item id is a whole number, got {value!r}")
    return int(number)


class page_errors:
    """Turn nearsight's one-line errors into gr.Error (a message on the page, an AppError with
    that message in gradio_client)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, NearsightError):
            # the toast renders HTML: names from uploads must not become markup
            raise gr.Error(html.escape(str(error), quote=False), print_exception=False) from None


def filter_help(view: GalleryView) -> str:
    """The filter box's help: the syntax, and this gallery's columns with their types."""
    types = view.gallery.column_types()
    tags = gallery_list_columns(view.gallery.meta)  # tag columns: KEY=TAG tests a set
    columns = ", ".join(
        [*(f"{name} ({'tags' if name in tags else kind})" for name, kind in sorted(types.items())),
         "label", "class_name", "split"]
    )  # fmt: skip
    return (
        "KEY=VALUE, KEY=A|B (any of), KEY!=VALUE, KEY>=N or date, KEY<N, KEY= (no value), "
        "separated by ';' "
        f"over: {columns}"
    )


def item_box_label(view: GalleryView) -> str:
    column = view.key_column
    return f"Item id or {column}" if column else "Item id"


def no_search(error: Exception) -> str:
    return message_html(f"No search: the filter was not applied ({error}). Fix it and press Enter.")


def item_of(view: GalleryView, value: Any) -> int:
    """The item box's value: a key the gallery holds, else a whole number as an id."""
    given = item_value(value)
    if isinstance(given, str) and view.key_column is not None:
        try:
            return view.id_of_key(given)
        except NearsightError:
            pass
    try:
        item = int(given)
    except ValueError:
        what = "key" if view.key_column else "id (the gallery has no key column)"
        raise PageError(f"gallery {view.name} has no item with {what} {given!r}") from None
    view.row(item)  # one-line error for an unknown id
    return item


def item_card(view: GalleryView, item: int) -> QueryCard:
    """The query card of a gallery item searched by (its leave-one-out grid, and its pages)."""
    label = view.label_of(item)
    return QueryCard(
        title=f"gallery item #{item}",
        thumbnail=view.thumbnail(item),
        label=label,
        class_name=view.class_name(label),
        kind="item",
        item_id=item,
        key=view.key_of(item),
    )


def rerank_toggle(view: GalleryView, on: bool | None) -> RerankSpec | None:
    """The page's re-rank toggle: None (not given) uses the view's default; on uses
    :func:`toggled_rerank`; off searches plainly."""
    if on is None:
        return None
    return toggled_rerank(view) if on else NONE


def toggled_rerank(view: GalleryView) -> RerankSpec:
    """The re-ranking the page's toggle turns on: the view's default, or :data:`PAGE_RERANK`
    where the gallery stores none."""
    return view.rerank if view.rerank.active else parse_rerank(PAGE_RERANK)
