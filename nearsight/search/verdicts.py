"""What the page's grids and the notebook's (search.results) share: a neighbour's verdict
against the query's class, the frame colour that shows it, and small inline thumbnails."""

from __future__ import annotations

import base64
import io

from PIL import Image

# green: the query's class; red: another class; grey: the query's class (or the item's) unknown
FRAME_COLOURS = {"true": "#16a34a", "false": "#dc2626", "unknown": "#9ca3af"}
QUERY_COLOUR = "#2563eb"
THUMBNAIL_SIDE = 160  # pixels, the longer side of a grid thumbnail


def correctness(query_label: int | None, neighbour_label: int | None) -> str:
    """ "true", "false" or "unknown" (no class on either side; -1 is unlabelled)."""
    if query_label is None or query_label < 0 or neighbour_label is None or neighbour_label < 0:
        return "unknown"
    return "true" if neighbour_label == query_label else "false"


def thumbnail_uri(image: Image.Image, side: int = THUMBNAIL_SIDE) -> str:
    """``image`` shrunk to ``side`` pixels on its longer side, as a JPEG data URI."""
    small = image.convert("RGB")
    small.thumbnail((side, side), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
