"""What a page user sends, checked, and nearsight's errors as the page shows them."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from nearsight.core.errors import NearsightError

UNKNOWN_CLASS = "-1"


class PageError(NearsightError):
    """Bad input from a page user (shown on the page as a one-line message)."""



def filter_note(filters: str | None) -> str:
    """The status line under the grid while a filter is on."""
    text = " ".join((filters or "").split())
    return f"Filtered: only items with `{html.escape(text)}`" if text else ""


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

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, NearsightError):
            # the toast renders HTML: names from uploads must not become markup
            raise gr.Error(html.escape(str(error), quote=False), print_exception=False) from None
        return False
