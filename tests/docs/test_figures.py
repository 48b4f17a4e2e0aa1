"""Every measured figure the user pages quote comes from a results file the page names, and
equals that file's number as printed. The pages' prose (code blocks, code spans, comments and
addresses aside) is read for decimal figures: each must be registered here with its file and
how to read it, or be a setting (a goal, a threshold), so a figure typed in by hand fails."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "bench/results/"
PAGES = ("README.md", "docs/demo.md", "docs/rerank.md")


def _run(results: list[dict], variant: str) -> dict:
    return next(run for run in results if run["variant"] == variant)


def _recipe_seeds(data: dict) -> list[float]:
    return [run["trained_recall@1"] for run in data["results"] if run["variant"] == "demo"]


def _unseen(data: dict, variant: str) -> str:
    runs = sorted((r for r in data["runs"] if r["variant"] == variant), key=lambda r: r["seed"])
    return " / ".join(f"{r['unseen_recall@1']:.4f}" for r in runs)


def _quality(gallery: str, method: str) -> Callable[[dict], str]:
    return lambda data: f"{data[gallery]['methods'][method]['map@r']:.3f}"


def _goal_rows(data: dict, index_type: str) -> list[dict]:
    """bench/filtered_search.py's end-to-end rows of the filters its goal names: single
    filters of 0.1-20% of the items, the far group and the conjunctions."""
    rows = data["types"][index_type]["filters"]
    return [
        row["search_vector"]
        for name, row in rows.items()
        if name == "far"
        or name.startswith("and")
        or (name.split()[0] in ("random", "equal", "cap", "category")
            and float(name.split()[1]) <= 0.2)
    ]  # fmt: skip


def _goal_recall(data: dict) -> str:
    return f"{min(r['recall'] for t in data['types'] for r in _goal_rows(data, t)):.3f}"


# page -> (figure as printed, results file, the figure read from the file's JSON)
FIGURES: dict[str, list[tuple[str, str, Callable[[Any], str]]]] = {
    "README.md": [
        ("0.996", "filtered_search_1m_coarse_2026-11-28.json", _goal_recall),
        (
            "9.2",
            "filtered_search_1m_2026-11-28.json",
            lambda d: f"{max(r['cpu_p50_ms'] for r in _goal_rows(d, 'ivfpq')):.1f}",
        ),
        (
            "6.83",
            "filtered_search_1m_coarse_2026-11-28.json",
            lambda d: f"{max(r['cpu_p50_ms'] for r in _goal_rows(d, 'hnsw')):.2f}",
        ),
    ],
    "docs/demo.md": [
        (
            "0.0525",
            "demo_recipe_300steps.json",
            lambda d: f"{_run(d['results'], 'demo')['untrained_recall@1']:.4f}",
        ),
        (
            "0.354",
            "demo_recipe_300steps.json",
            lambda d: f"{_run(d['results'], 'demo')['trained_recall@1']:.3f}",
        ),
        (
            "0.422",
            "demo_recipe_800steps_h100.json",
            lambda d: f"{statistics.mean(_recipe_seeds(d)):.3f}",
        ),
        ("0.385", "demo_recipe_800steps_h100.json", lambda d: f"{min(_recipe_seeds(d)):.3f}"),
        ("0.448", "demo_recipe_800steps_h100.json", lambda d: f"{max(_recipe_seeds(d)):.3f}"),
    ],
    "docs/rerank.md": [
        ("0.606", "rerank_quality.json", _quality("digits", "none")),
        ("0.646", "rerank_quality.json", _quality("digits", "overall")),
        ("0.144", "rerank_quality.json", _quality("demo", "none")),
        ("0.156", "rerank_quality.json", _quality("demo", "overall")),
        ("1.10x", "rerank_rest.json", lambda d: f"{d['aqe_ratio']:.2f}x"),
        ("1.50x", "rerank_rest.json", lambda d: f"{d['kreciprocal_ratio']:.2f}x"),
        ("0.7254", "rerank_pairwise_unseen.json", lambda d: f"{d['plain_unseen_recall@1']:.4f}"),
        (
            "2.3x",
            "rerank_pairwise_cost.json",
            lambda d: f"{d['cost']['pairwise@1_ms'] / d['cost']['none@1_ms']:.1f}x",
        ),
        (
            "2.8x",
            "rerank_pairwise_cost.json",
            lambda d: f"{d['cost']['pairwise+layer3@1_ms'] / d['cost']['none@1_ms']:.1f}x",
        ),
        ("UNSEEN_DEFAULT", "rerank_pairwise_unseen.json", lambda d: _unseen(d, "default")),
        ("UNSEEN_LAYER3", "rerank_pairwise_unseen.json", lambda d: _unseen(d, "layer3")),
    ],
}
# figures that are settings, not measurements: the demo's goal, the re-ranker test's bound,
# the README's smallest filter share
SETTINGS = {"docs/demo.md": {"0.50"}, "docs/rerank.md": {"0.005"}, "README.md": {"0.1"}}


def prose_figures(text: str) -> set[str]:
    """The decimal figures of a Markdown page outside code, comments and addresses."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`]+`", "", text)
    text = re.sub(r"https?://\S+", "", text)
    return set(re.findall(r"(?<![\w.])\d+\.\d+x?", text))


CASES = [(page, *figure) for page, figures in FIGURES.items() for figure in figures]


@pytest.mark.parametrize(("page", "figure", "results", "read"), CASES,
                         ids=[f"{c[0]}:{c[1][:20]}" for c in CASES])  # fmt: skip
def test_each_quoted_figure_is_its_results_files(page, figure, results, read):
    text = (ROOT / page).read_text()
    data = json.loads((ROOT / RESULTS / results).read_text())
    printed = read(data)
    if figure.isupper():  # a row of figures, found by the file's own numbers
        assert printed in text, (page, results, printed)
    else:
        assert printed == figure, (page, results, printed)
        assert figure in prose_figures(text), (page, figure)
    assert RESULTS + results in text, f"{page} quotes {results} without naming it"


@pytest.mark.parametrize("page", PAGES)
def test_no_page_quotes_a_figure_without_its_file(page):
    text = (ROOT / page).read_text()
    known = {figure for figure, _, _ in FIGURES.get(page, []) if not figure.isupper()}
    known |= SETTINGS.get(page, set())
    for figure, results, read in FIGURES.get(page, []):
        if figure.isupper():  # the rows' figures
            known |= set(read(json.loads((ROOT / RESULTS / results).read_text())).split(" / "))
    assert prose_figures(text) - known == set()


def test_the_sweep_finds_a_figure_typed_in():
    assert prose_figures("Recall@1 0.71 (`--held-out 0.2`)\n```sh\nx 0.3\n```\n") == {"0.71"}


@pytest.mark.parametrize("page", PAGES)
def test_the_user_pages_stay_short(page):
    """Pages say what a user does and sees; the record of how goes to docs/decisions.md."""
    assert len((ROOT / page).read_text().splitlines()) < 150
