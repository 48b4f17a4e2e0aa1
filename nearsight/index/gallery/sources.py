"""What a gallery is built from: image files, each with its catalog fields, and where they came
from (a dataset's split, a list of paths, a list file). :func:`nearsight.index.gallery.build.
build_gallery` embeds a :class:`GallerySource`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.store import CATALOG_FILE


@dataclass(frozen=True)
class GallerySource:
    """``paths`` (absolute) with one catalog-fields dict each (label, class_name, split, meta;
    empty for bare images) and ``meta``: the gallery meta saying where they came from."""

    paths: list[Path]
    fields: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.paths) != len(self.fields):
            raise ValueError("a GallerySource needs one fields dict per path")


def absolute_path(path: str | os.PathLike[str]) -> Path:
    """Absolute and normalised ("a/../b" -> "b"), symlinks kept: what the catalog records."""
    return Path(os.path.abspath(Path(path).expanduser()))


def dataset_source(
    dataset: str,
    root: str | os.PathLike[str],
    split: str = "auto",
    meta_types: Mapping[str, str] | None = None,
) -> GallerySource:
    """A dataset's split (``auto``: its test split where it has one, else every item; a note on
    stderr says which). Each item keeps the split its dataset gives it."""
    from nearsight.data.datasets import load_dataset, resolve_split

    chosen = resolve_split(dataset, root) if split == "auto" else split
    loaded = load_dataset(dataset, root, chosen, dict(meta_types or {}))
    if split == "auto":
        why = "its own test split" if chosen == "test" else "no split of its own: every item"
        print(f"split: {chosen} ({dataset} has {why}; --split to choose)", file=sys.stderr)
    fields = [
        {"label": s.label, "class_name": s.class_name, "split": s.split, "meta": s.meta}
        for s in loaded.samples
    ]
    meta = {"dataset": dataset, "root": str(absolute_path(loaded.root)), "split": chosen}
    return GallerySource([absolute_path(s.path) for s in loaded.samples], fields, meta)


def images_source(paths: Iterable[str | os.PathLike[str]]) -> GallerySource:
    """Image files without labels."""
    absolute = [absolute_path(path) for path in paths]
    if not absolute:
        raise NearsightError("no images to build a gallery of")
    return GallerySource(absolute, [{} for _ in absolute], {"source": "images"})


def list_source(list_file: str | os.PathLike[str]) -> GallerySource:
    """The images a text file names, one per line (``#`` comments; relative to the file)."""
    list_path = Path(list_file)
    try:
        text = list_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot read image list {list_path}: {reason}") from None
    base = absolute_path(list_path).parent
    paths = [
        absolute_path(base / Path(entry).expanduser())
        for entry in (line.strip() for line in text.splitlines())
        if entry and not entry.startswith("#")
    ]
    if not paths:
        raise NearsightError(f"image list {list_path} names no images")
    return GallerySource(paths, [{} for _ in paths], {"source": str(absolute_path(list_path))})


def check_out_folder(out: Path) -> None:
    """Refuse a folder that is not a gallery before spending minutes embedding."""
    if out.exists() and not out.is_dir():
        raise NearsightError(f"cannot write a gallery to {out}: it is a file")
    if out.is_dir() and any(out.iterdir()) and not (out / CATALOG_FILE).is_file():
        raise NearsightError(
            f"{out} already exists and is not a nearsight gallery (no {CATALOG_FILE}): "
            "choose a new folder or remove it"
        )
