"""The page over a shop's catalog: cards lead with the item's key and the fields the search
filtered on (the key column sorts last and there are more columns than a card has room for),
every field one hover or click away, the operator's --card-fields, and the page's messages
(the banner, the matching count, a filter that was not applied, notes, the filter help, the
query box, the Map legend). The same in Debian's chromium at the end."""

from __future__ import annotations

import re

import pytest
from helpers import CHROMIUM, free_port, run, running_page, upload
from helpers.browser import open_tab

from nearsight.app.page.html import META_SHOWN
from nearsight.app.page.map_tab import legend_html


@pytest.fixture(scope="module")
def shop(shop_once):
    """The session's shop catalog (helpers.make_shop): this module only reads it."""
    return shop_once


@pytest.fixture(scope="module")
def product(product_once):
    """The session's product gallery (helpers.make_product): this module only reads it."""
    return product_once


@pytest.fixture(scope="module")
def served(shop):
    with running_page([shop["gallery"]]) as (url, demo):
        yield url, demo


def cells(html: str) -> list[dict]:
    """Each neighbour cell: its id, key and the fields its caption shows, in order."""
    found = []
    for cell in re.findall(r'<figure class="ns-cell"(.*?)</figure>', html, re.DOTALL):
        caption = cell.split("<details")[0]
        found.append({
            "id": int(re.search(r'data-id="(\d+)"', cell).group(1)),
            "key": (re.search(r'data-key="([^"]*)"', cell) or [None, None])[1],
            "shown": re.findall(r'class="ns-(?:key|field)" data-field="([^"]+)"', caption),
            "all": re.findall(r'<div data-field="([^"]+)"', cell),
        })  # fmt: skip
    return found


def test_cards_lead_with_the_key_then_the_filtered_fields(served, shop):
    page = served[1].nearsight
    view = page.view(None)
    columns = sorted(view.gallery.meta_keys())
    assert columns[-1] == "sku" and len(columns) > META_SHOWN  # the case the issue found
    item = view.id_of_key("00007")
    grid, status, state = page.item_grid(None, "00007", 8)  # the item box takes a key
    assert state == {"kind": "item", "id": item}
    assert 'class="ns-key">00007</strong>' in grid  # the query card names its key
    found = cells(grid)
    assert len(found) == 8
    for cell in found:
        assert cell["shown"][0] == "sku" and cell["key"] == view.row(cell["id"])["meta"]["sku"]
        assert cell["shown"][1] == "name"  # the title: a column named title or name
        assert len(cell["shown"]) == META_SHOWN
        assert sorted(cell["all"]) == sorted(view.row(cell["id"])["meta"])  # one click away
    grid, status, _ = page.item_grid(None, item, 8, "shop=Café; price<40")
    for cell in cells(grid):
        assert cell["shown"][:4] == ["sku", "name", "shop", "price"]
        assert view.row(cell["id"])["meta"]["shop"] == "Café"
    matching = sum(
        1 for row in view.rows().values()
        if row["meta"]["shop"] == "Café" and row["meta"]["price"] < 40
    )  # fmt: skip
    assert f"nearest of {matching} matching items (of {len(view)})" in grid
    assert "`shop=Café; price<40`" in status and "&lt;" not in status  # escaped once, by markdown


def test_card_fields_chosen_by_the_operator(shop):
    from nearsight.app.page.layout import build_app
    from nearsight.core.errors import NearsightError

    demo = build_app([shop["gallery"]], device="cpu", analyse=False, card_fields=["price", "shop"])
    try:
        grid, _, _ = demo.nearsight.item_grid(None, 0, 4)
        assert all(cell["shown"][:2] == ["price", "shop"] for cell in cells(grid))
    finally:
        demo.nearsight.galleries.close()
    with pytest.raises(NearsightError, match="no column 'nosuch'"):
        build_app([shop["gallery"]], device="cpu", analyse=False, card_fields=["nosuch"])


def test_serve_refuses_card_fields_the_gallery_lacks(capsys, shop):
    code, _, err = run(capsys, "serve", "--gallery", shop["gallery"], "--port", free_port(),
                       "--card-fields", "sku,nosuch")  # fmt: skip
    assert code == 2 and "--card-fields: gallery gallery has no column 'nosuch'" in err


def test_a_bad_filter_leaves_no_stale_grid_and_notes_name_close_values(served):
    page = served[1].nearsight
    grid, _, _ = page.item_grid(None, 0, 8)
    assert cells(grid)
    grid, status, state = page.rerun(None, {"kind": "item", "id": 0}, None, 8, None, "shop==Café")
    assert not cells(grid) and "ns-message" in grid and "typo" in status
    assert state == {"kind": "item", "id": 0}  # fixing the filter redraws this item
    grid, status, _ = page.item_grid(None, 0, 8, "shop=cafe")
    assert not cells(grid) and "'Café'" in status and "0 matching items" in grid


def test_gallery_choice_updates_the_filter_help_and_item_box(served, product, shop):
    from nearsight.app.page.layout import build_app

    demo = build_app([shop["gallery"], product["gallery"]], device="cpu", analyse=False)
    try:
        page = demo.nearsight
        shop_name, product_name = page.names
        *_, help_shop, box_shop = page.gallery_changed(shop_name)
        *_, help_product, box_product = page.gallery_changed(product_name)
        assert "added (date)" in help_shop["info"] and "added" not in help_product["info"]
        assert box_shop["label"] == "Item id or sku" and box_product["label"] == "Item id"
    finally:
        demo.nearsight.galleries.close()


def test_random_item_clears_the_upload_and_the_map_has_a_legend(served):
    page = served[1].nearsight
    view = page.view(None)
    grid, _, state, box, query_image = page.random_item(None, "-1", 4)
    assert query_image is None and box == view.row(state["id"])["meta"]["sku"]
    legend = legend_html(view)
    assert "leave-one-out failure" in legend
    assert all(name in legend for name in view.class_names.values())


# -- in Debian's chromium -----------------------------------------------------------------------

browser_only = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")


@pytest.fixture
def tab(browser_context, served, request):
    """A tab (not yet on any page) whose ``outside`` lists requests that left the server."""
    with open_tab(browser_context, request, served[0], navigate=False) as page:
        yield page


@browser_only
def test_cards_show_each_neighbours_key_in_the_browser(tab, served, shop):
    view = served[1].nearsight.view(None)
    tab.goto(served[0])
    tab.wait_for_selector("#ns-results .ns-message")
    upload(tab, shop["images"][0])  # an upload, then a key: the upload leaves the query box
    tab.wait_for_selector("#ns-results .ns-cell")
    tab.locator("#ns-item-id input, #ns-item-id textarea").first.fill("00007")
    tab.locator("#ns-item-id input, #ns-item-id textarea").first.press("Enter")
    tab.wait_for_selector('#ns-results .ns-result[data-query-kind="item"]')
    keys = tab.locator("#ns-results .ns-cell .ns-key")
    assert keys.count() == 8
    for n in range(8):
        cell = tab.locator("#ns-results .ns-cell").nth(n)
        item = int(cell.get_attribute("data-id"))
        sku = view.row(item)["meta"]["sku"]
        assert keys.nth(n).is_visible() and keys.nth(n).inner_text() == f"sku={sku}"
        lines = [cell.locator(part).first.bounding_box()["y"]
                 for part in (".ns-key", '.ns-field[data-field="name"]', ".ns-class")]  # fmt: skip
        assert lines == sorted(lines) and len(set(lines)) == 3  # key, title, then the rank
        assert f"shop={view.row(item)['meta']['shop']}" in cell.get_attribute("title")  # hover
    assert tab.locator("#ns-query-image img").count() == 0
    first = tab.locator("#ns-results .ns-cell").first
    first.locator(".ns-all-fields summary").click()  # opens the list, does not search
    assert first.locator(".ns-all-fields div").count() == len(view.gallery.meta_keys())
    item = view.id_of_key("00007")
    assert tab.locator(f'#ns-results .ns-result[data-id="{item}"]').count()
    assert tab.outside == []


@browser_only
def test_api_docs_load_nothing_from_another_host(tab, served):
    tab.goto(served[0].rstrip("/") + "/api/docs")
    tab.wait_for_selector(".swagger-ui .info .title")
    tab.wait_for_selector('.opblock-summary-path[data-path="/search"]')
    assert tab.outside == []


def test_a_cards_title_is_a_title_or_name_column_else_the_first_text_column_not_filtered():
    from nearsight.app.page.html import card_fields, title_columns

    types = {"added": "date", "brand": "str", "colour": "str", "price": "float", "sku": "str"}
    titles = title_columns(types)
    assert titles == ["brand", "colour", "sku"]
    meta = {"added": "2025-01-02", "brand": "Ä", "colour": "red", "price": 2.5, "sku": "7"}
    assert card_fields(meta, ["sku"], [], titles=titles) == ["sku", "brand", "added", "colour"]
    assert card_fields(meta, ["sku"], ["brand"], titles=titles)[:3] == ["sku", "colour", "brand"]
    assert title_columns({**types, "name": "str", "title": "str"}) == ["title", "name"]
