"""The page in a real browser: Debian's chromium (/usr/bin/chromium) driven by Playwright,
against the real server on 127.0.0.1. Never `playwright install` (no internet): `make test`
installs the Debian package when it is missing. A failing test leaves a screenshot in
test-artifacts/."""

from __future__ import annotations

import re

import pytest
from helpers import CHROMIUM, upload
from helpers.browser import open_tab
from PIL import Image


@pytest.fixture(scope="module")
def tiny(tiny_once):
    """The session's tiny gallery (helpers.make_tiny_gallery): this module only reads it
    (and writes new files beside it)."""
    return tiny_once


GREEN, RED, GREY = "rgb(22, 163, 74)", "rgb(220, 38, 38)", "rgb(156, 163, 175)"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="no /usr/bin/chromium (Debian package chromium; `make test` installs it)",
)
pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")


@pytest.fixture
def page(browser_context, tiny_page, request):
    """A fresh tab on the page, in the test's own browsing context; ``page.outside`` lists
    requests that left 127.0.0.1. On a failure the tab's screenshot is saved to
    test-artifacts/<test>.png."""
    with open_tab(browser_context, request, tiny_page[0], ready="#ns-results .ns-message") as tab:
        yield tab


def border_colour(locator) -> str:
    return locator.evaluate("element => getComputedStyle(element).borderTopColor")


def test_an_upload_shows_k_thumbnails_framed_by_class(page, tiny):
    item = tiny.items[6]  # a gallery file: the page knows its class (identical bytes)
    upload(page, item["path"])
    page.wait_for_selector("#ns-results .ns-cell[data-rank='8']")
    cells = page.locator("#ns-results .ns-cell")
    assert cells.count() == 8
    assert page.locator("#ns-results .ns-query").inner_text().count(item["class_name"]) >= 1
    labels = {row["id"]: row["label"] for row in tiny.items}
    seen = set()
    for rank in range(1, 9):
        cell = page.locator(f"#ns-results .ns-cell[data-rank='{rank}']")
        right = labels[int(cell.get_attribute("data-id"))] == item["label"]
        assert cell.get_attribute("data-correct") == ("true" if right else "false")
        assert border_colour(cell) == (GREEN if right else RED)
        assert cell.locator("img").evaluate("img => img.complete && img.naturalWidth > 0")
        seen.add(right)
    assert seen == {True, False}  # the random net mixes classes: both colours are checked
    first = page.locator("#ns-results .ns-cell[data-rank='1']")
    assert first.get_attribute("data-id") == str(item["id"])  # uploads are not left out


def test_an_unlabelled_upload_is_neutral_until_given_a_class(page, tiny):
    item = tiny.items[13]
    flipped = tiny.root / "flipped-browser.png"
    Image.open(item["path"]).transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(flipped)
    upload(page, flipped)
    page.wait_for_selector("#ns-results .ns-cell[data-rank='8']")
    cells = page.locator("#ns-results .ns-cell")
    for index in range(cells.count()):
        assert cells.nth(index).get_attribute("data-correct") == "unknown"
        assert border_colour(cells.nth(index)) == GREY
    # give the query its class through the dropdown: the frames turn green/red
    page.locator("#ns-query-class input").click()
    page.get_by_role("option", name=item["class_name"], exact=True).click()
    page.wait_for_selector(f"#ns-results .ns-result[data-query-label='{item['label']}']")
    verdicts = {
        page.locator("#ns-results .ns-cell").nth(i).get_attribute("data-correct") for i in range(8)
    }
    assert verdicts <= {"true", "false"} and verdicts


def test_k_changes_the_number_of_thumbnails(page, tiny):
    page.click("#ns-random")
    page.wait_for_selector("#ns-results .ns-result[data-query-kind='item']")
    k_box = page.locator("#ns-k input[type='number']")
    k_box.fill("3")
    k_box.press("Tab")  # the slider's number box reports on blur
    page.wait_for_selector("#ns-results .ns-result[data-k='3']")
    assert page.locator("#ns-results .ns-cell").count() == 3


def test_a_failing_query_opens_from_the_failure_list_with_a_red_rank_1(page, tiny_page):
    failures = tiny_page[1].nearsight.view("gallery").analysis().failures
    assert failures
    page.get_by_role("tab", name="Failures").click()
    table = page.locator("#ns-failures")
    first_id = table.locator("[data-testid='cell-0-0']")  # row 1, column "id"
    first_id.wait_for()
    clicked = int(first_id.inner_text().strip())
    first_id.click()
    grid = page.locator("#ns-failure-results")
    grid.locator(f".ns-result[data-id='{clicked}']").wait_for()
    rank_1 = grid.locator(".ns-cell[data-rank='1']")
    assert rank_1.get_attribute("data-correct") == "false"
    assert border_colour(rank_1) == RED
    expected = next(f for f in failures if f.id == clicked)
    assert rank_1.get_attribute("data-id") == str(expected.top1_id)


def test_clicking_a_neighbour_queries_by_it(page, tiny):
    page.click("#ns-random")
    page.wait_for_selector("#ns-results .ns-result[data-query-kind='item']")
    third = page.locator("#ns-results .ns-cell[data-rank='3']")
    target = third.get_attribute("data-id")
    third.click()
    page.wait_for_selector(f"#ns-results .ns-result[data-query-kind='item'][data-id='{target}']")
    ids = [page.locator("#ns-results .ns-cell").nth(i).get_attribute("data-id") for i in range(8)]
    assert target not in ids  # leave-one-out


def test_a_non_image_upload_shows_a_message(page, tiny):
    fake = tiny.root / "fake.png"
    fake.write_text("definitely not a PNG")
    upload(page, fake)
    page.get_by_text("cannot read image fake.png").first.wait_for()


def test_the_summary_and_nothing_fetched_from_outside(page, tiny):
    upload(page, tiny.items[0]["path"])
    page.wait_for_selector("#ns-results .ns-cell[data-rank='8']")
    page.get_by_role("tab", name="Summary").click()
    metric = page.locator("#ns-metrics [data-testid='cell-0-0']")
    metric.wait_for()
    assert metric.inner_text().strip() == "recall@1"
    page.locator("#ns-distances canvas, #ns-distances svg").first.wait_for()
    page.get_by_role("tab", name="Failures").click()
    page.locator("#ns-failures [data-testid='cell-0-0']").wait_for()
    assert page.outside == []


def test_the_rerank_toggle_redraws_the_grid_and_the_failures_tab_lists_its_changes(page, tiny_page):
    from nearsight.search.rerank.changes import rerank_changes

    handlers = tiny_page[1].nearsight
    view = handlers.view("gallery")
    spec = handlers.rerank_spec(view, True)
    # an item whose neighbours re-ranking re-orders, so the redraw is visible
    item = next(
        int(i)
        for i in view.labelled_ids
        if [n.id for n in view.search_item(int(i), 8, leave_out=True)]
        != [n.id for n in view.search_item(int(i), 8, rerank=spec, leave_out=True)]
    )
    page.locator("#ns-item-id input").fill(str(item))
    page.click("#ns-open")
    page.wait_for_selector(f"#ns-results .ns-result[data-query-kind='item'][data-id='{item}']")

    def shown() -> list[int]:
        cells = page.locator("#ns-results .ns-cell")
        return [int(cells.nth(i).get_attribute("data-id")) for i in range(cells.count())]

    plain = shown()
    assert plain == [n.id for n in view.search_item(item, 8, leave_out=True)]
    page.locator("#ns-rerank input").check()
    expected = [n.id for n in view.search_item(item, 8, rerank=spec, leave_out=True)]
    page.wait_for_function(
        "ids => [...document.querySelectorAll('#ns-results .ns-cell')]"
        ".map(c => Number(c.dataset.id)).join() === ids.join()",
        arg=expected,
    )
    assert item not in shown()  # still leave-one-out
    page.get_by_role("tab", name="Failures").click()
    page.get_by_text("What re-ranking changes").click()
    page.click("#ns-rerank-changes")
    changes = rerank_changes(view.gallery, spec)
    fixed = sum(change.fixed for change in changes)
    page.get_by_text(f"{fixed} queries fixed").first.wait_for()
    if changes:
        first = page.locator("#ns-changes [data-testid='cell-0-0']")
        assert int(first.inner_text().strip()) == changes[0].id


def test_a_facet_pick_adds_its_filter_and_narrows_the_grid(page, tiny_page):
    """The facets beside the filter box list the gallery's class names with their counts;
    picking one writes its filter into the box and searches again, within that class."""
    view = tiny_page[1].nearsight.view("gallery")
    page.click("#ns-random")
    page.wait_for_selector("#ns-results .ns-result[data-query-kind='item']")
    page.locator("#ns-facets input").click()
    option = page.get_by_role("option").first
    label = option.inner_text().strip()  # "class_name: NAME (COUNT)"
    name, count = re.fullmatch(r"class_name: (.+) \((\d+)\)", label).groups()
    option.click()
    box = page.locator("#ns-filter textarea")
    page.wait_for_function(
        "text => document.querySelector('#ns-filter textarea').value.includes(text)",
        arg=f"class_name={name}",
    )
    assert box.input_value().strip() == f"class_name={name}"
    label_of = {n: label for label, n in view.gallery.class_names().items()}[name]
    page.wait_for_function(
        "label => [...document.querySelectorAll('#ns-results .ns-cell')].every("
        "cell => cell.dataset.label === String(label))",
        arg=label_of,
    )
    cells = page.locator("#ns-results .ns-cell")
    assert 0 < cells.count() <= int(count)
    assert page.outside == []
