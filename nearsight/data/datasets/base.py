"""What every dataset reader returns, and the helpers they share.

A reader turns a dataset folder in its official layout into a :class:`DatasetSplit`: a sorted
list of :class:`Sample` (image path, integer label, class name). Deep metric learning splits by
class, not by image: the train and test splits have no class in common, so retrieval is tested
on classes the network never saw.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nearsight.core.errors import NearsightError
from nearsight.data.meta import MetaValue

SPLITS = ("train", "test", "all")
# auto: the dataset's own test split where it has one (cub, cars, sop; train/ and test/
# folders; a CSV's split column), else every item
SPLIT_CHOICES = (*SPLITS, "auto")

# Extensions (lower case) that folder and synthetic datasets treat as images.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"}
)


class DatasetLayoutError(NearsightError):
    """A dataset folder that is not in the expected layout; the message names the missing file."""


@dataclass(frozen=True)
class Sample:
    """One image of a dataset: where it is, its integer class label and the class's name;
    ``meta``: the source's extra columns (a CSV manifest's columns beyond path,label,split);
    ``split``: the split it belongs to, train or test (None: the dataset does not say)."""

    path: Path
    label: int | None  # None: unlabelled (a catalog item without a class)
    class_name: str | None
    meta: dict[str, MetaValue] = field(default_factory=dict, compare=False, hash=False)
    split: str | None = field(default=None, compare=False, hash=False)


@dataclass
class DatasetSplit:
    """The images of one split of one dataset, sorted by (label, path)."""

    name: str
    root: Path
    split: str
    samples: list[Sample]

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> list[int | None]:
        """Each image's label, None where unlabelled (see :meth:`require_labels`)."""
        return [sample.label for sample in self.samples]

    @property
    def paths(self) -> list[Path]:
        return [sample.path for sample in self.samples]

    @property
    def class_names(self) -> dict[int | None, str | None]:
        """Label -> class name, for the classes present in this split."""
        return {sample.label: sample.class_name for sample in self.samples}

    @property
    def num_classes(self) -> int:
        return len({sample.label for sample in self.samples})

    def require_labels(self) -> list[int]:
        """Every image's label; a one-line error when some have none (training needs every
        one)."""
        labels = [sample.label for sample in self.samples if sample.label is not None]
        missing = len(self.samples) - len(labels)
        if missing:
            raise DatasetLayoutError(
                f"{missing} images of the {self.name} dataset at {self.root} have no label: "
                "training needs a label on every image"
            )
        return labels

    def class_counts(self) -> dict[int | None, int]:
        """Label -> number of images, sorted by label."""
        return dict(sorted(Counter(self.labels).items()))


def make_split(name: str, root: Path, split: str, samples: Iterable[Sample]) -> DatasetSplit:
    """Sort the samples deterministically and refuse an empty split (nothing to train on or
    search is always a mistake in the data, and is clearer here than later)."""
    ordered = sorted(
        samples,
        key=lambda sample: (-1 if sample.label is None else sample.label, str(sample.path)),
    )
    if not ordered:
        raise DatasetLayoutError(f"the {split} split of the {name} dataset at {root} has no images")
    return DatasetSplit(name=name, root=root, split=split, samples=ordered)


def normalise_root(root: str | os.PathLike[str]) -> Path:
    return Path(root).expanduser().absolute()


def find_root(root: Path, markers: Sequence[str], title: str, expected: str) -> Path:
    """The folder holding all ``markers``: ``root`` itself or one of its immediate sub-folders
    (so ``--root`` may name the dataset folder or the folder it was extracted into).

    Raises :class:`DatasetLayoutError` naming the first missing marker of the closest candidate
    (the one with the most markers; ``root`` on ties).
    """
    if not root.exists():
        raise DatasetLayoutError(f"not a {title} folder: {root} does not exist")
    if not root.is_dir():
        raise DatasetLayoutError(f"not a {title} folder: {root} is a file, not a folder")
    candidates = [root] + sorted((child for child in _subdirs(root)), key=lambda child: child.name)
    best, best_found = root, -1
    for candidate in candidates:
        found = sum((candidate / marker).is_file() for marker in markers)
        if found == len(markers):
            return candidate
        if found > best_found:
            best, best_found = candidate, found
    missing = next(marker for marker in markers if not (best / marker).is_file())
    raise DatasetLayoutError(
        f"not a {title} folder: {best} has no {missing} "
        f"(expected {expected} in the folder or one of its sub-folders)"
    )


def require_dir(folder: Path, title: str, expected: str) -> None:
    if not folder.is_dir():
        raise DatasetLayoutError(
            f"not a {title} folder: {folder.parent} has no {folder.name}/ (expected {expected})"
        )


def read_lines(path: Path, title: str) -> list[str]:
    """A text file's non-blank lines; unreadable files become a :class:`DatasetLayoutError`."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise DatasetLayoutError(f"cannot read {title} file {path}: {reason}") from None
    return [line for line in text.splitlines() if line.strip()]


def bad_line(path: Path, line_number: int, expected: str) -> DatasetLayoutError:
    return DatasetLayoutError(f"{path} line {line_number}: expected {expected}")


def class_disjoint_halves(class_names: Sequence[str]) -> tuple[set[str], set[str]]:
    """Sorted class names split in two: the first half (rounded up) train, the rest test."""
    ordered = sorted(class_names)
    cut = len(ordered) - len(ordered) // 2
    return set(ordered[:cut]), set(ordered[cut:])


def is_image_file(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _subdirs(folder: Path) -> Iterable[Path]:
    try:
        entries = list(os.scandir(folder))
    except OSError as error:
        raise DatasetLayoutError(f"cannot list {folder}: {error.strerror or error}") from None
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir():
            yield Path(entry.path)
