"""Duplicate images (nearsight/search/inspect/duplicates.py): 25 copies planted in a gallery
(5 byte-identical, 20 resized by 5-15% and recompressed) are found at recall and precision of
at least 0.9, each step measured; copies planted across two galleries are found with
``against``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import FAST, tiny_model
from helpers.inspect_data import plant_copies

from nearsight.app.cli import main
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.search.inspect.duplicates import find_duplicates

pytest.importorskip("imagehash")
pytest.importorskip("torch")  # the galleries are built with a checkpoint


def build(model: Path, root: Path, out: Path, split: str) -> Path:
    argv = ["index", "build", "--model", model, "--dataset", "folder", "--root", root,
            "--split", split, "--out", out, *FAST]  # fmt: skip
    assert main([str(arg) for arg in argv]) == 0
    return out


def planted_ids(gallery: Path, gallery_b: Path, pairs: list[tuple[Path, Path]]) -> set:
    with Gallery.open(gallery) as first, Gallery.open(gallery_b) as second:
        ids_a = {Path(row["path"]).resolve(): row["id"] for row in first.all_items()}
        ids_b = {Path(row["path"]).resolve(): row["id"] for row in second.all_items()}
    found = set()
    for source, copy in pairs:
        a, b = ids_a.get(source.resolve()), ids_b.get(copy.resolve())
        if gallery == gallery_b:
            a, b = (
                min(ids_a[source.resolve()], ids_a[copy.resolve()]),
                max(ids_a[source.resolve()], ids_a[copy.resolve()]),
            )
        found.add((a, b))
    return found


def scores(frame, planted: set) -> tuple[float, float]:
    reported = set(zip(frame["a_id"], frame["b_id"], strict=True))
    hits = len(reported & planted)
    return hits / len(planted), hits / max(len(reported), 1)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("dup-model") / "model.pt", seed=0)


def test_planted_copies_are_found_at_recall_and_precision_0_9(model, tmp_path):
    data = tmp_path / "data"
    write_synthetic(data, classes=10, per_class=12, size=64, seed=4)
    sources = sorted(data.rglob("*.png"))
    chosen = [sources[i] for i in np.random.default_rng(0).permutation(len(sources))[:25]]
    pairs = plant_copies(chosen, data / "train", identical=5, resized=20, seed=1)
    gallery = build(model, data, tmp_path / "gallery", "all")

    found = find_duplicates(gallery)
    planted = planted_ids(gallery, gallery, pairs)
    assert len(planted) == 25
    candidate_recall, _ = scores(found.candidate_pairs, planted)
    recall, precision = scores(found.pairs, planted)
    print(f"threshold {found.threshold:.4f}: {found.candidates} candidates (recall "
          f"{candidate_recall:.2f}), {found.confirmed} confirmed: recall {recall:.2f}, "
          f"precision {precision:.2f}")  # fmt: skip
    assert candidate_recall >= 0.9
    assert recall >= 0.9 and precision >= 0.9, (recall, precision)
    assert found.pairs["same_bytes"].sum() == 5
    # the embedding alone proposes more than the copies: the pixels make the difference
    assert found.candidates > found.confirmed


def test_copies_across_two_galleries_are_found_with_against(model, tmp_path):
    data = tmp_path / "data"
    write_synthetic(data, classes=8, per_class=10, size=64, seed=5)
    train_images = sorted((data / "train").rglob("*.png"))
    pairs = plant_copies(train_images[::4][:10], data / "test", identical=3, resized=7, seed=2)
    train = build(model, data, tmp_path / "train", "train")
    test = build(model, data, tmp_path / "test", "test")

    found = find_duplicates(train, test)
    planted = planted_ids(train, test, pairs)
    recall, precision = scores(found.pairs, planted)
    assert recall >= 0.9 and precision >= 0.9, (recall, precision, found.summary())
    # inside the test gallery alone there are none of these pairs
    assert set(zip(find_duplicates(test).pairs["a_id"], find_duplicates(test).pairs["b_id"],
                   strict=True)) & planted == set()  # fmt: skip
