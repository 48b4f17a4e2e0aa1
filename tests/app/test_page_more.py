"""The page's "more" control and its grouped grid: a click adds the next page of the same
search (filters and re-ranking included) and the grid then equals the long search; on a gallery
that records a group column the grid shows one card per product, its best photo and its photo
count, equal to the searcher's grouped answer, and "more" pages through the products; a tag
column shows as a list on the cards. The same in Debian's chromium at the end, with every
request on 127.0.0.1."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import CHROMIUM, running_page
from helpers.browser import open_tab

from nearsight.app.page.more import More


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


GROUP = "class_name"  # a product: the photos of one class (a SKU in a real shop)


@pytest.fixture(scope="module")
def grouped_gallery(shop, tmp_path_factory) -> Path:
    """The shop's gallery recording ``class_name`` as its group column (--group-column)."""
    from nearsight.index.gallery.change import set_meta
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.groups import GROUP_COLUMN_META

    folder = tmp_path_factory.mktemp("grouped") / "products"
    shutil.copytree(shop["gallery"], folder)
    with Gallery.open(folder) as gallery:
        set_meta(gallery, **{GROUP_COLUMN_META: GROUP})
    return folder


@pytest.fixture(scope="module")
def served(shop, grouped_gallery):
    with running_page([shop["gallery"], grouped_gallery], analyse=False) as (url, demo):
        yield url, demo


def cells(html: str) -> list[dict]:
    """Each card of a grid: its rank, id, product value and photo count (None: not grouped)."""
    found = []
    for cell in re.findall(r'<figure class="ns-cell"(.*?)</figure>', html, re.DOTALL):
        photos = re.search(r'data-photos="(\d+)"', cell)
        found.append({
            "rank": int(re.search(r'data-rank="(\d+)"', cell).group(1)),
            "id": int(re.search(r'data-id="(\d+)"', cell).group(1)),
            "group": (re.search(r'data-group="([^"]*)"', cell) or [None, None])[1],
            "photos": None if photos is None else int(photos.group(1)),
            "shown": re.findall(r'<span class="ns-photos">([^<]*)</span>', cell),
        })  # fmt: skip
    return found


def ids(html: str) -> list[int]:
    return [cell["id"] for cell in cells(html)]


@pytest.mark.parametrize(
    "filters, rerank", [("", None), ("shop=Café|north", None), ("", True), ("price>10", True)]
)
def test_more_adds_the_next_page_of_the_same_item_search(served, filters, rerank):
    page = served[1].nearsight
    more = More(page)
    item = page.view("gallery").id_of_key("00007")
    grid, _, state = page.item_grid("gallery", item, 4, filters, rerank)
    assert len(ids(grid)) == 4 and "pages" not in state
    longer, _, _ = page.item_grid("gallery", item, 12, filters, rerank)
    inputs = ("gallery", state, None, 4, None, filters, rerank)
    grid2, _, state2 = more.more(*inputs)
    assert state2 == {**state, "pages": 2}
    assert ids(grid2) == ids(longer)[:8] and ids(grid2)[:4] == ids(grid)  # ranks 5-8 appended
    assert [c["rank"] for c in cells(grid2)] == list(range(1, 9))
    grid3, _, state3 = more.more("gallery", state2, None, 4, None, filters, rerank)
    assert ids(grid3) == ids(longer) and state3["pages"] == 3


def test_more_after_an_upload_and_at_the_end_of_the_results(served, shop):
    page = served[1].nearsight
    more = More(page)
    image = str(shop["images"][5])
    grid, _, state = page.upload_grid("gallery", image, 5, None, "shop=Café")
    longer, _, _ = page.upload_grid("gallery", image, 10, None, "shop=Café")
    grid2, status, state2 = more.more("gallery", state, image, 5, None, "shop=Café", None)
    assert ids(grid2) == ids(longer) and ids(grid2)[:5] == ids(grid)
    assert 'data-query-kind="upload"' in grid2 and "No more" not in status
    cafe = sum(row["meta"]["shop"] == "Café" for row in page.view("gallery").rows().values())
    assert cafe == 12  # 2 pages of 5, then the last 2, then nothing more
    grid3, status, state3 = more.more("gallery", state2, image, 5, None, "shop=Café", None)
    assert len(ids(grid3)) == 12 and "No more results" in status
    # nothing searched yet: nothing changes
    import gradio as gr

    assert more.more("gallery", None, None, 5, None) == (gr.skip(), gr.skip(), gr.skip())


def test_a_grouped_grid_shows_one_card_per_product_and_more_pages_through_them(served):
    page = served[1].nearsight
    view = page.view("products")
    assert view.group_column == GROUP
    item = view.id_of_key("00013")
    grid, _, state = page.item_grid("products", item, 2)
    first = cells(grid)
    assert len(first) == 2 and "2 nearest products" in grid
    grid2, _, state2 = More(page).more("products", state, None, 2, None, "", None)
    shown = cells(grid2)
    assert shown[:2] == first
    expected = view.search_item(item, 4, leave_out=True, group_by=GROUP).groups
    assert [c["group"] for c in shown] == [g.value for g in expected]
    assert len({c["group"] for c in shown}) == 4  # one card per product
    for cell, group in zip(shown, expected, strict=True):
        assert cell["id"] == group.neighbours[0].id  # its best photo
        assert cell["photos"] == group.count
        assert cell["shown"] == [f"{group.count} photos"]
    counts = {}
    for row in view.rows().values():
        counts[row["class_name"]] = counts.get(row["class_name"], 0) + 1
    assert all(cell["photos"] == counts[cell["group"]] for cell in shown)  # 6 photos each
    assert len({cell["group"] for cell in cells(page.item_grid("products", item, 8)[0])}) == 6


def test_tag_values_show_as_lists_on_the_cards():
    from nearsight.app.page.html import QueryCard, result_html
    from nearsight.search.neighbour import Neighbour

    hit = Neighbour(1, 3, None, "a.png", 0, "a", 0.5, {"tags": ["red", "blue"], "note": "a|b"})
    card = QueryCard("q", None, None, "unknown", "upload")
    grid = result_html(card, [hit], [None], ["a"], gallery="g", gallery_size=1)
    assert "tags=[red, blue]" in grid and "note=a|b" in grid


# -- in Debian's chromium -----------------------------------------------------------------------

browser_only = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")


@pytest.fixture
def tab(browser_context, served, request):
    with open_tab(browser_context, request, served[0], ready="#ns-results .ns-message") as page:
        yield page


def _grid_ids(tab) -> list[int]:
    grid = tab.locator("#ns-results .ns-cell")
    return [int(grid.nth(n).get_attribute("data-id")) for n in range(grid.count())]


def _open_item(tab, key: str) -> None:
    box = tab.locator("#ns-item-id input, #ns-item-id textarea").first
    box.fill(key)
    box.press("Enter")


@browser_only
def test_facets_and_more_in_the_browser(tab, served):
    page = served[1].nearsight
    item = page.view("gallery").id_of_key("00007")
    _open_item(tab, "00007")
    tab.wait_for_selector(f'#ns-results .ns-result[data-query-kind="item"][data-id="{item}"]')
    # a facet value adds its filter and narrows the grid
    tab.locator("#ns-facets input").click()
    tab.get_by_role("option", name=re.compile(r"^shop: Café \(\d+\)$")).click()
    tab.wait_for_selector("#ns-results .ns-summary:has-text('12 matching items')")
    assert "shop=Café" in tab.locator("#ns-filter textarea, #ns-filter input").first.input_value()
    cafe = _grid_ids(tab)
    assert len(cafe) == 8
    assert all(page.view("gallery").row(i)["meta"]["shop"] == "Café" for i in cafe)
    # "more" appends ranks 9-16 of the same filtered search (12 match: 3 more, the query left out)
    tab.click("#ns-more")
    tab.wait_for_selector("#ns-results .ns-result[data-k='11']")
    longer, _, _ = page.item_grid("gallery", item, 16, "shop=Café")
    assert _grid_ids(tab) == ids(longer) and _grid_ids(tab)[:8] == cafe
    assert tab.outside == []


@browser_only
def test_a_grouped_grid_in_the_browser(tab, served):
    view = served[1].nearsight.view("products")
    tab.locator("#ns-gallery input").click()
    tab.get_by_role("option", name="products", exact=True).click()
    tab.wait_for_selector("#ns-header strong:has-text('products')")  # the gallery changed
    k_box = tab.locator("#ns-k input[type='number']")
    k_box.fill("3")
    k_box.press("Tab")
    _open_item(tab, "00013")
    tab.wait_for_selector("#ns-results .ns-result[data-k='3'] .ns-cell[data-photos]")
    first = _grid_ids(tab)
    tab.click("#ns-more")  # the next 3 products
    tab.wait_for_selector("#ns-results .ns-result[data-k='6']")
    item = view.id_of_key("00013")
    expected = view.search_item(item, 6, leave_out=True, group_by=GROUP).groups
    assert _grid_ids(tab) == [g.neighbours[0].id for g in expected] and _grid_ids(tab)[:3] == first
    groups = [tab.locator("#ns-results .ns-cell").nth(n).get_attribute("data-group")
              for n in range(6)]  # fmt: skip
    assert groups == [str(g.value) for g in expected] and len(set(groups)) == 6  # one per product
    for n in range(6):
        cell = tab.locator("#ns-results .ns-cell").nth(n)
        assert cell.get_attribute("data-photos") == "6"
        assert cell.locator(".ns-photos").inner_text() == "6 photos"
    assert tab.outside == []
