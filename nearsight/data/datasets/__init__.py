"""Dataset readers: the official layouts of CUB-200-2011, CARS196 and Stanford Online Products,
an image folder, a CSV manifest (and the synthetic dataset, written as an image folder).

``load_dataset(name, root, split)`` returns a :class:`DatasetSplit` whose splits are
class-disjoint (the deep metric learning protocol): train on some classes, retrieve others.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from nearsight.core.errors import NearsightError
from nearsight.data.datasets.base import (
    IMAGE_EXTENSIONS,
    SPLIT_CHOICES,
    SPLITS,
    DatasetLayoutError,
    DatasetSplit,
    Sample,
    normalise_root,
)

DATASETS = ("cub", "cars", "sop", "folder", "csv")

__all__ = [
    "DATASETS",
    "IMAGE_EXTENSIONS",
    "SPLIT_CHOICES",
    "SPLITS",
    "DatasetLayoutError",
    "DatasetSplit",
    "Sample",
    "load_dataset",
    "resolve_split",
]


def load_dataset(
    name: str,
    root: str | os.PathLike[str],
    split: str = "train",
    meta_types: Mapping[str, str] | None = None,
) -> DatasetSplit:
    """The samples of ``split`` ("train", "test", "all" or "auto": :func:`resolve_split`) of
    dataset ``name`` found at ``root`` (the dataset folder or, for cub/cars/sop, the folder it
    was extracted into)."""
    if name not in DATASETS:
        raise NearsightError(f"unknown dataset '{name}' (choose one of: {', '.join(DATASETS)})")
    if split not in SPLIT_CHOICES:
        raise NearsightError(f"unknown split '{split}' (choose one of: {', '.join(SPLIT_CHOICES)})")
    folder = normalise_root(root)
    if split == "auto":
        split = resolve_split(name, folder)
    if name == "cub":
        from nearsight.data.datasets.cub import load_cub

        return load_cub(folder, split)
    if name == "cars":
        from nearsight.data.datasets.cars import load_cars

        return load_cars(folder, split)
    if name == "sop":
        from nearsight.data.datasets.sop import load_sop

        return load_sop(folder, split)
    if name == "folder":
        from nearsight.data.datasets.folder import load_folder

        return load_folder(folder, split)
    from nearsight.data.datasets.csv_manifest import load_csv

    return load_csv(folder, split, meta_types)


def resolve_split(name: str, root: str | os.PathLike[str]) -> str:
    """What ``--split auto`` means for this dataset: ``test`` where the dataset has a split of
    its own (the benchmarks; ``train/`` and ``test/`` folders; a CSV's ``split`` column), else
    ``all`` (a catalog is indexed whole)."""
    folder = normalise_root(root)
    if name in ("cub", "cars", "sop"):
        return "test"
    if name == "folder":
        return "test" if (folder / "train").is_dir() and (folder / "test").is_dir() else "all"
    from nearsight.data.datasets.csv_manifest import has_split_column

    return "test" if has_split_column(folder) else "all"
