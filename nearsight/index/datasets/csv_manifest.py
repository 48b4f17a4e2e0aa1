"""A CSV manifest: columns ``path,label[,split]``, one row per image, and any extra columns.

``path`` is relative to the CSV file's folder (or absolute); ``label`` is a class name;
``split``, if present, is ``train`` or ``test`` for every row. Without a ``split`` column the
classes are split class-disjointly as for an image folder: the first half of the sorted class
names is train, the rest test. A label is the index of the class name in the sorted list of all
class names. ``--root`` is the CSV file, or a folder holding exactly one ``.csv`` file.
Extra columns (shop, price, SKU, URL...) become each item's metadata, typed as numbers or text
(index.filters); a column named like a catalog column (id, class_name, ...) is refused.
"""

from __future__ import annotations

import csv
from pathlib import Path

from nearsight.index.datasets.base import (
    DatasetLayoutError,
    DatasetSplit,
    Sample,
    class_disjoint_halves,
    make_split,
)
from nearsight.index.search.filters import FilterError, check_key, typed_meta

TITLE = "CSV manifest"
REQUIRED_COLUMNS = ("path", "label")
SPLIT_VALUES = ("train", "test")


def load_csv(root: Path, split: str) -> DatasetSplit:
    manifest = find_manifest(root)
    rows = _read_rows(manifest)
    all_names = sorted({row[1] for row in rows})
    label_of = {name: label for label, name in enumerate(all_names)}
    if rows[0][2] is not None:  # a split column: the file says which rows are which
        wanted = {"train": {"train"}, "test": {"test"}, "all": set(SPLIT_VALUES)}[split]
        chosen = [row for row in rows if row[2] in wanted]
    else:
        train, test = class_disjoint_halves(all_names)
        keep = {"train": train, "test": test, "all": train | test}[split]
        chosen = [row for row in rows if row[1] in keep]
    samples = [Sample(path, label_of[name], name, meta) for path, name, _, meta in chosen]
    return make_split("csv", manifest, split, samples)


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


def _read_rows(manifest: Path) -> list[tuple[Path, str, str | None, dict[str, object]]]:
    base = manifest.parent
    try:
        with open(manifest, encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            columns = [name.strip() for name in reader.fieldnames or []]
            reader.fieldnames = columns
            missing = [name for name in REQUIRED_COLUMNS if name not in columns]
            if missing:
                raise DatasetLayoutError(
                    f"not a {TITLE}: {manifest} has no '{missing[0]}' column "
                    f"(expected columns path,label[,split]; found {','.join(columns) or 'none'})"
                )
            has_split = "split" in columns
            extra = [name for name in columns if name and name not in ("path", "label", "split")]
            try:
                for name in extra:
                    check_key(name)
            except FilterError as error:
                raise DatasetLayoutError(f"{manifest}: column {error}") from None
            rows = []
            for row in reader:
                number = reader.line_num
                path_text = (row.get("path") or "").strip()
                name = (row.get("label") or "").strip()
                if not path_text or not name:
                    raise DatasetLayoutError(f"{manifest} line {number}: empty path or label")
                row_split = None
                if has_split:
                    row_split = (row.get("split") or "").strip().lower()
                    if row_split not in SPLIT_VALUES:
                        raise DatasetLayoutError(
                            f"{manifest} line {number}: split must be train or test, "
                            f"got '{row_split}'"
                        )
                meta = typed_meta({key: row.get(key) for key in extra})
                rows.append((base / path_text, name, row_split, meta))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        reason = " ".join(str(getattr(error, "strerror", None) or error).split())
        raise DatasetLayoutError(f"cannot read {TITLE} {manifest}: {reason}") from None
    if not rows:
        raise DatasetLayoutError(f"{TITLE} {manifest} has no rows")
    return rows
