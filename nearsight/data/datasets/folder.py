"""An image folder: one sub-folder per class (``ROOT/<class>/<image>``).

If ``ROOT`` has both ``train/`` and ``test/`` sub-folders, those are the splits
(``ROOT/train/<class>/...``, ``ROOT/test/<class>/...``; the synthetic dataset is written so).
Otherwise the classes are split class-disjointly: the first half of the sorted class names is
train, the second half test. A label is the index of the class name in the sorted list of all
class names (both splits), so labels mean the same thing in every split. Images are found by
extension anywhere under a class folder; hidden files and folders are skipped, and a class
folder without images is ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

from nearsight.data.datasets.base import (
    DatasetLayoutError,
    DatasetSplit,
    Sample,
    class_disjoint_halves,
    is_image_file,
    make_split,
)

TITLE = "image folder dataset"


def load_folder(root: Path, split: str) -> DatasetSplit:
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is a file, not a folder"
        raise DatasetLayoutError(f"not an {TITLE}: {root} {what}")

    if (root / "train").is_dir() and (root / "test").is_dir():
        by_split = {name: _class_images(root / name) for name in ("train", "test")}
        all_names = sorted(set(by_split["train"]) | set(by_split["test"]))
        chosen = {"train": ("train",), "test": ("test",), "all": ("train", "test")}[split]
        members: list[tuple[str, list[Path], str | None]] = [
            (name, by_split[part][name], part) for part in chosen for name in by_split[part]
        ]
    else:
        classes = _class_images(root)
        all_names = sorted(classes)
        train, test = class_disjoint_halves(all_names)
        keep = {"train": train, "test": test, "all": train | test}[split]
        # no split of its own: the halves are nearsight's, so an item says which only when one
        # half was asked for
        part = None if split == "all" else split
        members = [(name, classes[name], part) for name in all_names if name in keep]

    if not all_names:
        raise DatasetLayoutError(
            f"not an {TITLE}: {root} has no class sub-folders with images "
            "(expected ROOT/<class>/<image>, or ROOT/train/<class>/ and ROOT/test/<class>/)"
        )
    label_of = {name: label for label, name in enumerate(all_names)}
    samples = [
        Sample(path, label_of[name], name, split=part)
        for name, paths, part in members
        for path in paths
    ]
    return make_split("folder", root, split, samples)


def _class_images(folder: Path) -> dict[str, list[Path]]:
    """Class name -> its image files, for each non-hidden sub-folder that holds any."""
    classes: dict[str, list[Path]] = {}
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as error:
        raise DatasetLayoutError(f"cannot list {folder}: {error.strerror or error}") from None
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        images = _images_under(Path(entry.path))
        if images:
            classes[entry.name] = images
    return classes


def _images_under(folder: Path) -> list[Path]:
    images: list[Path] = []
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        images.extend(Path(current) / name for name in sorted(files) if is_image_file(name))
    return images
