"""Stanford Online Products (Song et al., 2016) in its official layout.

``Ebay_train.txt`` and ``Ebay_test.txt`` (header "image_id class_id super_class_id path", then
one line per image, e.g. "1 1 1 bicycle_final/111085122871_0.JPG") beside the twelve
super-class folders. The files are the split: 11,318 train classes, 11,316 test classes.
The 120k images are not checked here (too slow); a missing one is reported when it is loaded.
"""

from __future__ import annotations

from pathlib import Path

from nearsight.data.datasets.base import (
    DatasetSplit,
    Sample,
    bad_line,
    find_root,
    make_split,
    read_lines,
)

TITLE = "Stanford Online Products"
MARKERS = ("Ebay_train.txt", "Ebay_test.txt")
EXPECTED = "Ebay_train.txt, Ebay_test.txt and the class folders"
HEADER = ["image_id", "class_id", "super_class_id", "path"]
_FILES: dict[str, tuple[str, ...]] = {"train": ("Ebay_train.txt",), "test": ("Ebay_test.txt",)}
_FILES["all"] = _FILES["train"] + _FILES["test"]


def load_sop(root: Path, split: str) -> DatasetSplit:
    folder = find_root(root, MARKERS, TITLE, EXPECTED)
    samples = []
    for file_name in _FILES[split]:
        part = "train" if file_name in _FILES["train"] else "test"
        samples.extend(_read_list(folder, folder / file_name, part))
    return make_split("sop", folder, split, samples)


def _read_list(folder: Path, path: Path, part: str) -> list[Sample]:
    lines = read_lines(path, TITLE)
    if not lines or lines[0].split() != HEADER:
        raise bad_line(path, 1, f'the header "{" ".join(HEADER)}"')
    samples = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split(maxsplit=3)
        try:
            if len(parts) != 4:
                raise ValueError
            class_id = int(parts[1])
        except ValueError:
            raise bad_line(path, number, '"image_id class_id super_class_id path"') from None
        relative = parts[3].strip()
        super_class = relative.split("/", 1)[0].removesuffix("_final")
        name = f"{super_class}/{class_id}"
        samples.append(Sample(folder / relative, class_id, name, split=part))
    return samples
