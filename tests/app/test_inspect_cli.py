"""``nearsight inspect``: each action on a small gallery (exit 0, its JSON / CSV / HTML), the
report self-contained (every image inline, nothing fetched when chromium opens it offline),
and bad input as one line with exit 2."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser

import numpy as np
import pytest
from helpers import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, assert_one_line_error, run
from helpers.inspect_data import clustered_vectors, import_vectors

from nearsight.index.gallery.core import Gallery


class Links(HTMLParser):
    """Every tag and every attribute value of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self.grids = 0
        self.cells = 0

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        values = dict(attrs)
        self.attributes += [(name, value or "") for name, value in attrs]
        if "data-query" in values:
            self.grids += 1
        if values.get("class") == "cell":
            self.cells += 1


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A gallery imported from clustered vectors, keyed sku-NNNN, and a second one (the same
    items, vectors moved) to compare it with."""
    root = tmp_path_factory.mktemp("inspect-cli")
    vectors, labels = clustered_vectors(2, classes=8, per_class=(6, 10), dim=16, spread=2.0)
    keys = [f"sku-{row:04d}" for row in range(len(labels))]
    first = import_vectors(root, "first", vectors, labels, keys=keys)
    moved = vectors + 0.1 * np.random.default_rng(0).normal(size=vectors.shape).astype(np.float32)
    moved /= np.linalg.norm(moved, axis=1, keepdims=True)
    second = import_vectors(root, "second", moved, labels, keys=keys)
    return first, second


def test_failures_as_text_json_and_csv(capsys, keyed, tmp_path):
    gallery, _ = keyed
    code, out, err = run(capsys, "inspect", "failures", "--gallery", gallery, "--json")
    assert code == 0, err
    failures = json.loads(out)
    assert failures and all(f["key"].startswith("sku-") for f in failures)
    assert all(f["class"] != f["top1_class"] and f["margin"] > 0 for f in failures)

    code, out, err = run(capsys, "inspect", "failures", "--gallery", gallery,
                         "--csv", tmp_path / "f.csv")  # fmt: skip
    assert code == 0, err
    with open(tmp_path / "f.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["key"] for row in rows] == [f["key"] for f in failures]

    code, out, err = run(capsys, "inspect", "failures", "--gallery", gallery)
    assert code == 0, err
    assert out.startswith(f"{len(failures)} of ")
    assert failures[0]["class"] in out

    code, out, err = run(capsys, "inspect", "failures", "--gallery", gallery,
                         "--html", tmp_path / "f.html")  # fmt: skip
    assert code == 0, err
    page = (tmp_path / "f.html").read_text()
    assert page.count("data-query=") == min(len(failures), 50)
    assert failures[0]["key"] in page  # the cells name items by key


def test_compare_prints_counts_that_add_up(capsys, keyed):
    first, second = keyed
    code, out, err = run(capsys, "inspect", "compare", "--gallery", second, "--against", first,
                         "--json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["matched_by"] == "key"
    assert result["fixed"] - result["broken"] == round(result["delta recall@1"] * result["queries"])
    assert len(result["changed"]) == result["fixed"] + result["broken"]
    low, high = result["interval"]
    assert low <= result["delta recall@1"] <= high

    code, out, err = run(capsys, "inspect", "compare", "--gallery", second, "--against", first)
    assert code == 0, err
    assert f"fixed {result['fixed']}, broken {result['broken']}" in out


def test_labels_lists_suspects_with_a_suggested_class(capsys, keyed):
    pytest.importorskip("cleanlab")
    gallery, _ = keyed
    code, out, err = run(capsys, "inspect", "labels", "--gallery", gallery, "--top", "5",
                         "--json")  # fmt: skip
    assert code == 0, err
    suspects = json.loads(out)
    assert 0 < len(suspects) <= 5
    assert all(s["class"] != s["suggested class"] for s in suspects)
    assert [s["rank"] for s in suspects] == list(range(1, len(suspects) + 1))


def test_the_report_is_one_self_contained_file(capsys, onnx_gallery, tmp_path):
    out = tmp_path / "report.html"
    code, stdout, err = run(capsys, "inspect", "report", "--gallery", onnx_gallery.gallery,
                            "--out", out, "--k", "4", "--failures", "3")  # fmt: skip
    assert code == 0, err
    assert stdout.startswith(f"wrote {out}: recall@1 ")
    page = out.read_text()
    links = Links()
    links.feed(page)
    assert not {"script", "link", "iframe", "object", "embed"} & set(links.tags)
    sources = [value for name, value in links.attributes if name in ("src", "href")]
    assert sources and all(value.startswith("data:image/jpeg;base64,") for value in sources)
    assert "://" not in page and "url(" not in page and "@import" not in page
    assert links.grids == 3 and links.cells == 3 * (1 + 4)
    with Gallery.open(onnx_gallery.gallery) as gallery:
        assert f"{len(gallery)} items" in page


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")
def test_the_report_opens_offline_in_chromium_without_a_request(capsys, onnx_gallery, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    out = tmp_path / "report.html"
    assert run(capsys, "inspect", "report", "--gallery", onnx_gallery.gallery, "--out", out)[0] == 0
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(offline=True)
        tab = context.new_page()
        tab.set_default_timeout(TIMEOUT_MS)
        requests: list[str] = []
        tab.on("request", lambda request: requests.append(request.url))
        tab.goto(out.as_uri())
        tab.wait_for_load_state("load")
        loaded = tab.evaluate(
            "Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)"
        )
        images = tab.evaluate("document.images.length")
        browser.close()
    assert images > 0 and loaded
    assert [url for url in requests if not url.startswith(("data:", out.as_uri()))] == []


def test_duplicates_and_explain_on_an_image_gallery(capsys, onnx_gallery, tmp_path):
    pytest.importorskip("imagehash")
    code, out, err = run(capsys, "inspect", "duplicates", "--gallery", onnx_gallery.gallery,
                         "--json")  # fmt: skip
    assert code == 0, err
    found = json.loads(out)
    assert found["threshold"] > 0 and found["pairs"] == []  # distinct synthetic images

    pytest.importorskip("torch")
    png = tmp_path / "why.png"
    code, out, err = run(capsys, "inspect", "explain", "--gallery", onnx_gallery.gallery,
                         "--id", "0", "--id", "1", "--out", png)  # fmt: skip
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "similarity" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["failures", "--gallery", "{missing}"], "missing"),
        (["labels", "--gallery", "{first}", "--top", "0"], "--top"),
        (["report", "--gallery", "{first}", "--out", "{tmp}/r.html", "--k", "0"], "--k"),
        (["explain", "--gallery", "{first}", "--id", "1", "--out", "{tmp}/w.png"], "two items"),
        (
            ["explain", "--gallery", "{first}", "--id", "1", "--id", "2", "--out", "{tmp}/w.png"],
            "imported without a model",
        ),
        (["duplicates", "--gallery", "{first}", "--threshold", "3"], "--threshold"),
        (["compare", "--gallery", "{first}", "--against", "{missing}"], "missing"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, keyed, tmp_path, argv, fragment):
    first, _ = keyed
    names = {"first": first, "missing": tmp_path / "missing", "tmp": tmp_path}
    code, _, err = run(capsys, "inspect", *[arg.format(**names) for arg in argv])
    assert_one_line_error(code, err, fragment)


# One fresh interpreter runs the four actions in turn and reports the modules loaded after each
# (an interpreter start costs seconds). Modules only pile up: an action's report holds what it and
# the actions before it loaded, at least as strict a check as a fresh interpreter of its own.
RUN_ACTIONS = """
import contextlib, io, json, sys
from nearsight.app.cli import main
reports = {}
for action, argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    reports[action] = {"code": code, "modules": sorted(m for m in sys.modules if "." not in m)}
print(json.dumps(reports))
"""
ONNX_ACTIONS = ("failures", "compare", "report", "duplicates")


@pytest.fixture(scope="module")
def onnx_actions(onnx_gallery, tmp_path_factory) -> dict[str, dict]:
    """Each of :data:`ONNX_ACTIONS` on the session's ONNX gallery, in one fresh interpreter:
    action -> {"code", "modules"}."""
    import subprocess
    import sys

    gallery = onnx_gallery.gallery
    out = tmp_path_factory.mktemp("inspect-onnx") / "r.html"
    extra = {
        "failures": ["--json"],
        "compare": ["--against", gallery, "--json"],
        "report": ["--out", out],
        "duplicates": ["--json"],
    }
    steps = [(action, [str(arg) for arg in ["inspect", action, "--gallery", gallery,
                                               *extra[action]]])
             for action in ONNX_ACTIONS]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", RUN_ACTIONS, json.dumps(steps)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("action", ONNX_ACTIONS)
def test_inspecting_an_onnx_gallery_loads_no_torch(onnx_actions, action):
    """The serving path never imports torch: only `inspect explain` needs it."""
    report = onnx_actions[action]
    assert report["code"] == 0
    assert not {"torch", "torchvision", "onnx", "tensorboard"} & set(report["modules"])


BLOCKER = """
import runpy, sys
from importlib.abc import MetaPathFinder

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
sys.argv = ["nearsight", *{argv!r}]
runpy.run_module("nearsight.app.cli", run_name="__main__")
"""


@pytest.mark.parametrize(
    ("action", "blocked", "extra"),
    [
        ("labels", ["cleanlab", "sklearn"], "inspect"),
        ("duplicates", ["imagehash"], "inspect"),
        ("explain", ["torch", "torchvision"], "train"),
    ],  # fmt: skip
)
def test_an_action_without_its_extra_names_it(
    keyed, onnx_gallery, tmp_path, action, blocked, extra
):
    import subprocess
    import sys

    gallery = onnx_gallery.gallery
    argv = {
        "labels": ["inspect", "labels", "--gallery", gallery],
        "duplicates": ["inspect", "duplicates", "--gallery", gallery],
        "explain": ["inspect", "explain", "--gallery", gallery, "--id", "0", "--id", "1",
                    "--out", tmp_path / "w.png"],
    }[action]  # fmt: skip
    code = BLOCKER.format(blocked=blocked, argv=[str(arg) for arg in argv])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert f"pip install 'nearsight[{extra}]'" in lines[0]
