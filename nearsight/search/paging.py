"""A search's page, checked once for every face (the CLI, REST, the page and the Python API):
its ``offset`` (ranks before it) and the column it groups by, if any, with hits per group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.core import Gallery
from nearsight.search.checks import check_offset
from nearsight.search.groups import check_group_column, check_group_size


@dataclass(frozen=True)
class Page:
    """Which part of a search to answer: from rank (or group) ``offset + 1`` on; grouped by
    ``group_by`` with ``group_size`` hits a group, or not grouped (None)."""

    offset: int = 0
    group_by: str | None = None
    group_size: int = 1


FIRST_PAGE = Page()  # the first k ranks, not grouped


def check_page(
    gallery: Gallery,
    offset: Any = 0,
    group_by: Any = None,
    group_size: Any = 1,
    *,
    most_offset: int | None = None,
    most_group_size: int | None = None,
) -> Page:
    """A caller's page as a :class:`Page` (one-line NearsightError when a part is bad)."""
    offset = check_offset(offset, most_offset)
    size = check_group_size(group_size, most_group_size)
    if group_by is None:
        if size != 1:
            raise NearsightError("group_size needs group_by (the column to group by)")
        return Page(offset)
    return Page(offset, check_group_column(gallery, group_by), size)
