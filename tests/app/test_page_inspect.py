"""The page's inspection views in Debian's chromium: the Failures table with thumbnails, the
Inspect tab's comparison of two galleries of the same items (one query's two grids side by
side) and its suspected labels. A failing test leaves a screenshot in test-artifacts/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import CHROMIUM, FAST, running_page, tiny_model
from helpers.browser import open_tab

from nearsight.app.cli import main
from nearsight.search.inspect.compare import compare_galleries
from nearsight.search.inspect.labels import suspected_labels

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")
pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
pytest.importorskip("torch")  # the second gallery's model is a checkpoint


@pytest.fixture(scope="module")
def two(onnx_gallery, tmp_path_factory):
    """The session's ONNX gallery and a gallery of the same images by another network."""
    root = tmp_path_factory.mktemp("page-inspect")
    model = tiny_model(root / "other.pt", seed=5, dim=8)
    other = root / "other"
    argv = ["index", "build", "--model", model, "--dataset", "folder", "--root",
            onnx_gallery.data, "--split", "all", "--out", other, *FAST]  # fmt: skip
    assert main([str(arg) for arg in argv]) == 0
    with running_page([onnx_gallery.gallery, other]) as served:
        yield served, onnx_gallery.gallery, other


@pytest.fixture
def tab(browser_context, two, request):
    (url, _), _, _ = two
    with open_tab(browser_context, request, url) as page:
        yield page


def test_the_failure_table_shows_thumbnails(tab, two):
    tab.get_by_role("tab", name="Failures").click()
    first = tab.locator("#ns-failures [data-testid='cell-0-1'] img")
    first.wait_for()
    assert first.get_attribute("src").startswith("data:image/jpeg;base64,")
    assert tab.locator("#ns-failures [data-testid='cell-0-5'] img").count() == 1  # its top-1


def test_compare_lists_fixed_and_broken_and_shows_both_grids(tab, two):
    _, first, other = two
    expected = compare_galleries(first, other)
    changed = expected.counts["fixed"] + expected.counts["broken"]
    assert changed > 0
    tab.get_by_role("tab", name="Inspect").click()
    tab.click("#ns-compare")
    info = tab.locator("#ns-compare-info")
    info.get_by_text("queries (items matched by").wait_for()
    assert f"Fixed **{expected.counts['fixed']}**".replace("**", "") in info.inner_text()
    cell = tab.locator("#ns-compare-table [data-testid='cell-0-0']")
    cell.wait_for()
    item = int(cell.inner_text().strip())
    cell.click()
    tab.locator(f"#ns-compare-grid .ns-result[data-id='{item}']").wait_for()
    tab.locator("#ns-compare-grid-against .ns-result").wait_for()
    assert tab.locator("#ns-compare-grid .ns-cell").count() > 0
    assert tab.locator("#ns-compare-grid-against .ns-cell").count() > 0


def test_suspected_labels_list_with_a_suggested_class(tab, two):
    pytest.importorskip("cleanlab")
    tab.get_by_role("tab", name="Inspect").click()
    tab.click("#ns-labels")
    tab.locator("#ns-labels-info").get_by_text("most suspicious first").wait_for()
    _, first, _ = two
    expected = suspected_labels(first, top=200)
    assert len(expected) > 0  # a random network: many neighbourhoods disagree
    first_id = tab.locator("#ns-labels-table [data-testid='cell-0-1']")
    first_id.wait_for()
    assert int(first_id.inner_text().strip()) == int(expected.iloc[0]["id"])
    assert tab.locator("#ns-labels-table [data-testid='cell-0-2'] img").count() == 1
    first_id.click()
    tab.locator(f".ns-result[data-id='{int(expected.iloc[0]['id'])}']").last.wait_for()


def test_the_failures_export_as_csv_and_as_the_report(tab, two):
    tab.get_by_role("tab", name="Inspect").click()
    for button, suffix in (
        ("#ns-export-csv", "-failures.csv"),
        ("#ns-export-report", "-report.html"),
    ):
        tab.click(button)
        link = tab.locator(
            f"#ns-export-file a[download*='{suffix}'], #ns-export-file a[href*='{suffix}']"
        )
        link.first.wait_for()
        with tab.expect_download() as download:
            link.first.click()
        saved = Path(download.value.path())
        text = saved.read_text()
        if suffix.endswith(".csv"):
            assert text.startswith("id,key,path,class,top1_id")
        else:
            assert text.startswith("<!DOCTYPE html>") and "://" not in text


def test_why_a_match_draws_the_similarity_map(tab, two):
    tab.get_by_role("tab", name="Inspect").click()
    tab.get_by_text("Why a match").click()
    tab.locator("#ns-explain-a input").fill("0")
    tab.locator("#ns-explain-b input").fill("1")
    tab.click("#ns-explain")
    note = tab.locator("#ns-explain-note")
    note.get_by_text("Similarity").wait_for()
    shares = re.findall(r"sum to (-?[0-9.]+) and (-?[0-9.]+)", note.inner_text())[0]
    similarity = float(re.search(r"Similarity (-?[0-9.]+)", note.inner_text()).group(1))
    assert abs(float(shares[0]) - similarity) <= 1e-4 and abs(float(shares[1]) - similarity) <= 1e-4
    tab.locator("#ns-explain-map img").wait_for()
