"""The page's Failures table names items by key and shows thumbnails (without a browser: the
frame the page sends)."""

from __future__ import annotations

import pytest

from nearsight.app.page.tables import FAILURE_COLUMNS, FAILURE_TYPES, THUMBNAIL_ROWS, failure_frame
from nearsight.app.page.view import open_views


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


def test_the_failure_table_has_keys_and_thumbnails(shop):
    (view,) = open_views([shop["gallery"]], device="cpu")
    failures = view.analysis().failures
    assert failures
    frame = failure_frame(view, failures)
    assert list(frame.columns) == FAILURE_COLUMNS and len(FAILURE_TYPES) == len(FAILURE_COLUMNS)
    skus = {row["id"]: row["meta"]["sku"] for row in view.gallery.all_items()}
    for row in frame.to_dict("records"):
        assert row["key"] == skus[row["id"]] and row["top-1 key"] == skus[row["top-1 id"]]
    shown = frame.head(THUMBNAIL_ROWS)
    assert all(cell.startswith('<img src="data:image/jpeg;base64,') for cell in shown["image"])
    assert all(
        cell.startswith('<img src="data:image/jpeg;base64,') for cell in shown["top-1 image"]
    )
