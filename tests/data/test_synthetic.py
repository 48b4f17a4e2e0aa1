"""The synthetic dataset: deterministic bytes, class-disjoint halves, readable as a folder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nearsight.app.cli import main
from nearsight.core.errors import NearsightError
from nearsight.data.datasets import load_dataset
from nearsight.data.datasets.synthetic import MAX_CLASSES, SynthClass, render, write_synthetic

SMALL = {"classes": 6, "per_class": 4, "size": 32}


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_same_seed_gives_byte_identical_files(tmp_path):
    first = write_synthetic(tmp_path / "a", seed=3, **SMALL)
    write_synthetic(tmp_path / "b", seed=3, **SMALL)
    digests = _digests(tmp_path / "a")
    assert digests == _digests(tmp_path / "b")
    assert len([name for name in digests if name.endswith(".png")]) == 24
    assert (first.images, first.classes, first.train_classes, first.test_classes) == (24, 6, 3, 3)
    # No leftovers beside the output (the temporary folder was renamed into place).
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b"]


def test_an_image_depends_only_on_seed_class_and_index():
    alone = np.asarray(render(0, 4, 2, 32))
    for class_index, image_index in [(0, 0), (4, 1), (5, 3)]:
        render(0, class_index, image_index, 32)  # other images made in between change nothing
    np.testing.assert_array_equal(np.asarray(render(0, 4, 2, 32)), alone)
    assert not np.array_equal(np.asarray(render(0, 4, 3, 32)), alone)


def test_different_seeds_give_different_images(tmp_path):
    write_synthetic(tmp_path / "a", seed=0, **SMALL)
    write_synthetic(tmp_path / "b", seed=1, **SMALL)
    a, b = _digests(tmp_path / "a"), _digests(tmp_path / "b")
    pngs = [name for name in a if name.endswith(".png")]
    assert pngs == [name for name in b if name.endswith(".png")]  # same classes and names
    assert all(a[name] != b[name] for name in pngs)


def test_written_as_a_folder_dataset_with_class_disjoint_halves(tmp_path):
    out = tmp_path / "synth"
    write_synthetic(out, classes=5, per_class=3, size=24, seed=0)
    train = load_dataset("folder", out, "train")
    test = load_dataset("folder", out, "test")
    assert train.class_names == {
        0: "c000_circle_halves_red-blue",
        1: "c001_triangle_stripes_red-yellow",
        2: "c002_square_dots_blue-yellow",
    }
    assert test.class_names == {
        3: "c003_pentagon_checker_green-purple",
        4: "c004_star_rings_orange-teal",
    }
    assert train.class_counts() == {0: 3, 1: 3, 2: 3} and len(test) == 6
    assert [path.name for path in train.paths[:3]] == ["000.png", "001.png", "002.png"]
    with Image.open(train.paths[0]) as image:
        assert image.size == (24, 24) and image.mode == "RGB"
        assert not image.info or set(image.info) <= {"dpi"}  # no text chunks, no timestamps
    manifest = json.loads((out / "synthetic.json").read_text())
    assert manifest["seed"] == 0 and manifest["test"] == list(test.class_names.values())


def test_classes_combine_shared_attributes():
    # Every attribute value occurs in both halves of the default 100 classes, and all classes
    # up to MAX_CLASSES are distinct combinations.
    definitions = [SynthClass.of(index) for index in range(MAX_CLASSES)]
    combos = {(d.shape, d.pattern, d.colours) for d in definitions}
    assert len(combos) == MAX_CLASSES == 210
    train, test = definitions[:50], definitions[50:100]
    for attribute in ("shape", "pattern", "colours"):
        assert {getattr(d, attribute) for d in train} == {getattr(d, attribute) for d in test}
    # Fine-grained: c and c + 42 differ only in their colours.
    a, b = SynthClass.of(7), SynthClass.of(49)
    assert (a.shape, a.pattern) == (b.shape, b.pattern) and a.colours != b.colours


def test_rewrite_replaces_a_synthetic_dataset_but_refuses_other_folders(tmp_path):
    out = tmp_path / "synth"
    write_synthetic(out, seed=0, **SMALL)
    write_synthetic(out, classes=4, per_class=2, size=16, seed=0)
    assert len(load_dataset("folder", out, "all")) == 8

    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "holiday.jpg").write_bytes(b"...")
    with pytest.raises(NearsightError, match="not a synthetic dataset"):
        write_synthetic(precious, **SMALL)
    assert (precious / "holiday.jpg").read_bytes() == b"..."


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"classes": 1}, "--classes must be an integer >= 2"),
        ({"per_class": 1}, "--per-class must be an integer >= 2"),
        ({"size": 15}, "--size must be an integer >= 16"),
        ({"seed": -1}, "--seed must be an integer >= 0"),
        ({"classes": MAX_CLASSES + 1}, "at most 210"),
    ],
)
def test_arguments_are_checked(tmp_path, arguments, message):
    with pytest.raises(NearsightError, match=message):
        write_synthetic(tmp_path / "out", **arguments)
    assert not (tmp_path / "out").exists()


def test_cli_data_synth(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["data", "synth", "--out", str(out), "--classes", "4", "--per-class", "2"]
    assert main([*args, "--size", "16"]) == 0
    assert "wrote 8 images of 4 classes (2 train, 2 test)" in capsys.readouterr().out
    assert len(load_dataset("folder", out, "test")) == 4
    assert main([*args, "--size", "8"]) == 2
    assert "--size must be an integer >= 16" in capsys.readouterr().err
