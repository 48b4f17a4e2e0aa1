"""The page's product features: the embedding map and its click (in a real browser), the
per-class Recall@1 chart, the filter box, metadata on the cards, the webcam source, and the
Summary tab without server paths."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import CHROMIUM, upload
from helpers.browser import open_tab

from nearsight.app.page.map_tab import CLICK_RADIUS, PCA, build_map, project, recall_chart_html
from nearsight.app.page.tables import summary_markdown


@pytest.fixture(scope="module")
def tiny(tiny_once):
    """The session's tiny gallery (helpers.make_tiny_gallery): this module only reads it
    (and writes new files beside it)."""
    return tiny_once


def test_pca_projection_keeps_the_two_widest_directions():
    rng = np.random.default_rng(0)
    data = rng.normal(size=(200, 5)) * np.array([10.0, 3.0, 0.1, 0.1, 0.1])
    coords = project(data, PCA)
    spread = coords.std(axis=0)
    assert spread[0] == pytest.approx(10.0, rel=0.15) and spread[1] == pytest.approx(3, rel=0.15)


def test_map_points_and_recall_chart(tiny_page):
    _, demo = tiny_page
    view = next(iter(demo.nearsight.views.values()))
    emap = build_map(view, PCA)
    assert len(emap.ids) == len(view) and emap.image.size == (720, 520)
    failed = {f.id for f in view.analysis().failures}
    assert {int(i) for i in emap.ids[emap.failed]} == failed and failed
    item = int(emap.ids[3])
    x, y = emap.pixel_of(item)
    assert emap.nearest(x + 1, y - 1) == item
    assert emap.nearest(-100, -100) is None
    chart = recall_chart_html(view)
    recalls = [float(v) for v in re.findall(r'data-recall="([0-9.]+)"', chart)]
    assert len(recalls) == 6 and recalls == sorted(recalls)  # worst first
    labels = view.labels
    counts = {int(c): int((labels == c).sum()) for c in np.unique(labels)}
    misses = {c: sum(1 for f in view.analysis().failures if f.label == c) for c in counts}
    assert sorted(1 - misses[c] / counts[c] for c in counts) == pytest.approx(recalls, abs=1e-4)


def test_summary_shows_folder_names_unless_asked(tiny_page, tiny):
    _, demo = tiny_page
    view = next(iter(demo.nearsight.views.values()))
    hidden = summary_markdown(view)
    assert str(tiny.gallery) not in hidden and str(tiny.root) not in hidden
    assert f"`{tiny.gallery.name}`" in hidden and "`model.pt`" in hidden
    assert str(tiny.gallery) in summary_markdown(view, show_paths=True)


# -- in the browser ----------------------------------------------------------------------------

browser_only = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")


@pytest.fixture
def tab(browser_context, tiny_page, request):
    with open_tab(browser_context, request, tiny_page[0], ready="#ns-results .ns-message") as page:
        yield page


@browser_only
def test_clicking_a_map_point_shows_that_items_grid(tab, tiny_page):
    _, demo = tiny_page
    name = demo.nearsight.names[0]
    emap = demo.nearsight_maps.map(name, PCA)
    # the point farthest from every other one: a click on it cannot mean a neighbour
    gaps = np.hypot(*(emap.pixels[:, None, :] - emap.pixels[None, :, :]).transpose(2, 0, 1))
    np.fill_diagonal(gaps, np.inf)
    row = int(np.argmax(gaps.min(axis=1)))
    assert gaps[row].min() > CLICK_RADIUS / 2
    item = int(emap.ids[row])
    x, y = emap.pixel_of(item)
    tab.get_by_role("tab", name="Map").click()
    image = tab.wait_for_selector("#ns-map img")
    tab.wait_for_function("() => document.querySelector('#ns-map img')?.naturalWidth > 0")
    tab.wait_for_selector("#ns-recall .ns-recall-row")
    # the page may still be laid out as the map's panel fills: click once the image is still
    image.wait_for_element_state("stable")
    # where Gradio's click handler maps a pixel of the natural image (a scaled-down <img>),
    # from the image's own corner: Playwright clicks there once its box holds still
    left, top = image.evaluate(
        """(img, [x, y]) => {
            const box = img.getBoundingClientRect();
            const s = Math.min(box.width / img.naturalWidth, box.height / img.naturalHeight, 1);
            return [(box.width - img.naturalWidth * s) / 2 + (x + 0.5) * s,
                    (box.height - img.naturalHeight * s) / 2 + (y + 0.5) * s];
        }""",
        [x, y],
    )
    image.click(position={"x": left, "y": top})
    query = tab.wait_for_selector("#ns-map-results .ns-query")
    assert f"gallery item #{item}" in query.inner_text()
    assert tab.locator("#ns-map-results .ns-cell").count() == 8
    assert str(item) not in [
        tab.locator("#ns-map-results .ns-cell").nth(i).get_attribute("data-id") for i in range(8)
    ]


@browser_only
def test_filter_box_limits_the_grid(tab, tiny):
    item = tiny.items[9]
    tab.fill("#ns-filter textarea, #ns-filter input", f"label={item['label']}")
    upload(tab, item["path"])
    tab.wait_for_selector("#ns-status:has-text('Filtered')")
    cells = tab.locator("#ns-results .ns-cell")
    tab.wait_for_function("() => document.querySelectorAll('#ns-results .ns-cell').length == 4")
    labels = {cells.nth(i).get_attribute("data-label") for i in range(cells.count())}
    assert labels == {str(item["label"])}  # exactly the 4 items of its class, nothing else


def test_the_query_image_takes_the_webcam(tiny_page):
    _, demo = tiny_page
    (image,) = [c for c in demo.config["components"]
                if c.get("props", {}).get("elem_id") == "ns-query-image"]  # fmt: skip
    assert image["props"]["sources"] == ["upload", "webcam", "clipboard"]
