"""A CSV manifest: columns ``path,label[,split]``, one row per image, and any extra columns.

``path`` is relative to the CSV file's folder (or absolute); ``label`` is a class name (no
``label`` column, or an empty cell: the item is unlabelled, searchable and filterable but left
out of evaluation and training);
``split``, if present, is ``train`` or ``test`` for every row. Without a ``split`` column the
classes are split class-disjointly as for an image folder: the first half of the sorted class
names is train, the rest test. A label is the index of the class name in the sorted list of all
class names. ``--root`` is the CSV file, or a folder holding exactly one ``.csv`` file.
Extra columns (shop, price, SKU, URL...) become each item's metadata, typed as numbers or text
(index.catalog.filter_types); a column is numeric only if all its values are, or as declared by
``--meta-types`` (nearsight/data/meta.py); a column named like a catalog column
(id, class_name, ...) is refused.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

from nearsight.core.errors import NearsightError
from nearsight.data.csv_table import read_table
from nearsight.data.datasets.base import (
    DatasetLayoutError,
    DatasetSplit,
    Sample,
    class_disjoint_halves,
    make_split,
)
from nearsight.data.meta import FilterError, check_key, infer_types, typed_row

TITLE = "CSV manifest"
REQUIRED_COLUMNS = ("path",)  # no label column (or an empty cell): unlabelled items
SPLIT_VALUES = ("train", "test")


def load_csv(root: Path, split: str, meta_types: Mapping[str, str] | None = None) -> DatasetSplit:
    """``meta_types``: declared column types (nearsight/data/meta.py); the
    others are decided per whole column."""
    manifest = find_manifest(root)
    rows = _read_rows(manifest)
    try:
        types = infer_types([meta for *_, meta in rows], meta_types)
        typed_rows = [(path, name, part, typed_row(meta, types)) for path, name, part, meta in rows]
    except FilterError as error:
        raise DatasetLayoutError(f"{manifest}: {error}") from None
    all_names = sorted({row[1] for row in typed_rows if row[1] is not None})
    label_of = {name: label for label, name in enumerate(all_names)}
    if typed_rows[0][2] is not None:  # a split column: the file says which rows are which
        wanted = {"train": {"train"}, "test": {"test"}, "all": set(SPLIT_VALUES)}[split]
        chosen = [row for row in typed_rows if row[2] in wanted]
    else:
        train, test = class_disjoint_halves(all_names)
        keep = {"train": train, "test": test, "all": train | test}[split]
        part = None if split == "all" else split  # the halves are nearsight's, not the file's
        unlabelled = split == "all"  # a row without a class belongs to no half
        chosen = [
            (p, name, part, meta)
            for p, name, _, meta in typed_rows
            if name in keep or (name is None and unlabelled)
        ]
    samples = [
        Sample(path, None if name is None else label_of[name], name, meta, split=part)
        for path, name, part, meta in chosen
    ]
    return make_split("csv", manifest, split, samples)


def has_split_column(root: Path) -> bool:
    """Whether the manifest has a ``split`` column (its header only is read)."""
    manifest = find_manifest(root)
    try:
        with open(manifest, encoding="utf-8-sig", newline="") as handle:
            header = read_table(handle, str(manifest)).columns
    except (OSError, UnicodeDecodeError, csv.Error, NearsightError) as error:
        reason = " ".join(str(getattr(error, "strerror", None) or error).split())
        raise DatasetLayoutError(f"cannot read {TITLE} {manifest}: {reason}") from None
    return "split" in (name.strip() for name in header)


def find_manifest(root: Path) -> Path:
    """``root`` if it is a file, else the one ``.csv`` file directly inside ``root``."""
    if root.is_file():
        return root
    if not root.is_dir():
        raise DatasetLayoutError(f"not a {TITLE}: {root} does not exist")
    found = sorted(path for path in root.glob("*.csv") if path.is_file())
    if len(found) != 1:
        which = "no .csv file" if not found else f"{len(found)} .csv files ({found[0].name}, ...)"
        raise DatasetLayoutError(
            f"not a {TITLE}: {root} has {which} (pass the CSV file itself as --root, "
            "or a folder holding exactly one .csv with columns path,label[,split])"
        )
    return found[0]


# (image path, class name or None: unlabelled, split or None: no split column, raw metadata)
RawRow = tuple[Path, str | None, str | None, dict[str, str | None]]


def _read_rows(manifest: Path) -> list[RawRow]:
    base = manifest.parent
    try:
        with open(manifest, encoding="utf-8-sig", newline="") as handle:
            table = read_table(handle, str(manifest))  # its width checked before any row
            columns = table.columns
            missing = [name for name in REQUIRED_COLUMNS if name not in columns]
            if missing:
                raise DatasetLayoutError(
                    f"not a {TITLE}: {manifest} has no '{missing[0]}' column "
                    f"(expected columns path,label[,split]; found {','.join(columns) or 'none'})"
                )
            has_split = "split" in columns
            extra = [name for name in columns if name and name not in ("path", "label", "split")]
            try:
                for column in extra:
                    check_key(column)
            except FilterError as error:
                raise DatasetLayoutError(f"{manifest}: column {error}") from None
            rows: list[RawRow] = []
            for number, row in table.rows():
                path_text = (row.get("path") or "").strip()
                name = (row.get("label") or "").strip() or None
                if not path_text:
                    raise DatasetLayoutError(f"{manifest} line {number}: empty path")
                row_split: str | None = None
                if has_split:
                    row_split = (row.get("split") or "").strip().lower()
                    if row_split not in SPLIT_VALUES:
                        raise DatasetLayoutError(
                            f"{manifest} line {number}: split must be train or test, "
                            f"got '{row_split}'"
                        )
                meta = {key: row.get(key) for key in extra}  # typed by whole column later
                rows.append((base / path_text, name, row_split, meta))
    except (OSError, UnicodeDecodeError, csv.Error, NearsightError) as error:
        if isinstance(error, DatasetLayoutError):
            raise
        reason = " ".join(str(getattr(error, "strerror", None) or error).split())
        raise DatasetLayoutError(f"cannot read {TITLE} {manifest}: {reason}") from None
    if not rows:
        raise DatasetLayoutError(f"{TITLE} {manifest} has no rows")
    return rows
