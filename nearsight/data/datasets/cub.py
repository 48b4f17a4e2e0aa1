"""CUB-200-2011 (Wah et al., 2011) in its official layout.

``images.txt`` ("image_id relative/path.jpg"), ``image_class_labels.txt`` ("image_id class_id"),
``classes.txt`` ("class_id 001.Black_footed_Albatross") and ``images/``. The metric learning
split (Song et al., 2016): classes 1-100 train, 101-200 test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nearsight.data.datasets.base import (
    DatasetLayoutError,
    DatasetSplit,
    Sample,
    bad_line,
    find_root,
    make_split,
    read_lines,
    require_dir,
)

TITLE = "CUB-200-2011"
MARKERS = ("images.txt", "image_class_labels.txt", "classes.txt")
EXPECTED = "images.txt, image_class_labels.txt, classes.txt and images/"
TRAIN_CLASSES = range(1, 101)

_NUMBER_PREFIX = re.compile(r"^\d+\.")


def load_cub(root: Path, split: str) -> DatasetSplit:
    folder = find_root(root, MARKERS, TITLE, EXPECTED)
    require_dir(folder / "images", TITLE, EXPECTED)

    class_names = {
        class_id: _NUMBER_PREFIX.sub("", name)
        for class_id, name in _pairs(folder / "classes.txt", "class_id class_name")
    }
    image_paths = dict(_pairs(folder / "images.txt", "image_id relative_path"))
    labels_file = folder / "image_class_labels.txt"
    image_labels = dict(_pairs(labels_file, "image_id class_id", int_value=True))

    samples = []
    for image_id, relative in image_paths.items():
        label = image_labels.get(image_id)
        if label is None:
            raise DatasetLayoutError(
                f"{labels_file} has no class for image {image_id} of images.txt"
            )
        if label not in class_names:
            raise DatasetLayoutError(
                f"{labels_file}: class {label} of image {image_id} is not in classes.txt"
            )
        in_train = label in TRAIN_CLASSES
        if split == "all" or (split == "train") == in_train:
            part = "train" if in_train else "test"
            samples.append(
                Sample(folder / "images" / relative, label, class_names[label], split=part)
            )
    return make_split("cub", folder, split, samples)


def _pairs(path: Path, expected: str, *, int_value: bool = False) -> Iterator[tuple[int, Any]]:
    """Parse "integer value" lines; the value is an integer or the rest of the line."""
    for number, line in enumerate(read_lines(path, TITLE), start=1):
        parts = line.split(maxsplit=1)
        if len(parts) != 2:
            raise bad_line(path, number, f'"{expected}"')
        try:
            key = int(parts[0])
            value = int(parts[1]) if int_value else parts[1].strip()
        except ValueError:
            raise bad_line(path, number, f'"{expected}", got "{line.strip()}"') from None
        yield key, value
