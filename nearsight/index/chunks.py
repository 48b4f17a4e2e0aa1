"""Finished chunks: the public format between embedding jobs and a gallery.

A chunk folder holds pairs ``NAME.npy`` + ``NAME.csv``, taken in the sort order of NAME:

- ``NAME.npy``: float32 (or float16/float64) [n, D] embeddings, one row per item;
- ``NAME.csv``: n rows with a header; optional ``label`` (an integer or a class name, empty or
  absent when unlabelled), ``path``, ``class_name``, ``split``, ``sha256``, ``width``,
  ``height``; any other column is the item's metadata (each column typed as a whole,
  nearsight/data/meta.py; ``id`` is ignored).

A pair counts as finished once both files exist under their names and agree on n: writers
write each file under a temporary name and rename it, the ``.csv`` last. ``nearsight index
build`` writes its chunks so (one process per shard under torchrun, resumable), and any other
job (Spark, Ray) can write the same folder for ``nearsight index import --vectors DIR --meta
DIR``. A single ``.npy`` and a single ``.csv``/``.parquet`` are accepted by import as well.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nearsight.core.arrays import load_array
from nearsight.core.errors import NearsightError
from nearsight.core.extras import EXTRA_MODULES
from nearsight.data.csv_table import read_table
from nearsight.data.meta import (
    BUILTIN_KEYS,
    FilterError,
    IsoDate,
    IsoDateTime,
    infer_types,
    label_codes,
    typed_row,
)
from nearsight.index.catalog.list_columns import stored_cell

META_FIELDS = ("path", "label", "class_name", "split", "sha256", "width", "height")
_INTEGER_FIELDS = ("label", "width", "height")


def write_chunk(folder: Path, name: str, vectors: np.ndarray, rows: list[dict[str, Any]]) -> None:
    """Write the finished pair ``name``.npy/.csv into ``folder`` (durably; .csv renamed last)."""
    if len(vectors) != len(rows):
        raise ValueError(f"{len(vectors)} vectors for {len(rows)} rows")
    folder.mkdir(parents=True, exist_ok=True)
    vector_tmp = folder / f".{name}.npy.{os.getpid()}.tmp"
    with open(vector_tmp, "wb") as handle:
        np.save(handle, np.ascontiguousarray(vectors, dtype=np.float32))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(vector_tmp, folder / f"{name}.npy")
    meta_tmp = folder / f".{name}.csv.{os.getpid()}.tmp"
    with open(meta_tmp, "w", newline="", encoding="utf-8") as handle:
        extra = sorted({key for row in rows for key in (row.get("meta") or {})})
        writer = csv.DictWriter(handle, fieldnames=[*META_FIELDS, *extra], extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            values = {**(row.get("meta") or {}), **{key: row.get(key) for key in META_FIELDS}}
            writer.writerow({key: "" if value is None else value for key, value in values.items()})
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(meta_tmp, folder / f"{name}.csv")


def finished_chunks(folder: Path) -> list[str]:
    """Names of the finished pairs in ``folder``, sorted (a pair whose .csv is missing is
    unfinished; one whose row counts disagree is refused)."""
    if not folder.is_dir():
        return []
    names = sorted(p.stem for p in folder.glob("*.csv") if (folder / f"{p.stem}.npy").is_file())
    return names


def read_vectors(path: Path) -> np.ndarray:
    """float32 [N, D] unit vectors from a ``.npy`` file or from a chunk folder's ``.npy`` files
    (in name order); rows are L2-normalised (inner product = cosine)."""
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise NearsightError(f"{path} holds no .npy vector files")
    elif path.is_file():
        files = [path]
    else:
        raise NearsightError(f"no vectors at {path}")
    parts = [_load_npy(file) for file in files]
    dims = {part.shape[1] for part in parts}
    if len(dims) != 1:
        raise NearsightError(f"the vector files in {path} have different dims: {sorted(dims)}")
    vectors = np.concatenate(parts) if len(parts) > 1 else np.ascontiguousarray(parts[0])
    vectors = vectors.astype(np.float32, copy=False)
    if not np.isfinite(vectors).all():
        raise NearsightError(f"the vectors in {path} contain NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms == 0).any():
        raise NearsightError(f"the vectors in {path} include an all-zero row")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


def read_meta(path: Path, meta_types: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Catalog rows from a ``.csv`` or ``.parquet`` file or a chunk folder's ``.csv`` files.
    Metadata columns are typed as a whole (``meta_types``: declared types,
    nearsight/data/meta.py); labels are integers or class names, coded as the
    CSV dataset reader codes them (sorted names: 0, 1, ...)."""
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise NearsightError(f"{path} holds no .csv meta files")
    elif path.is_file():
        files = [path]
    else:
        raise NearsightError(f"no meta file at {path}")
    rows: list[dict[str, Any]] = []
    for file in files:
        raw = _read_parquet(file) if file.suffix == ".parquet" else _read_csv(file)
        rows.extend(_clean(row, file, number) for number, row in enumerate(raw))
    labels, names = label_codes([row["label"] for row in rows])
    extras = [row.pop("meta") for row in rows]
    try:
        types = infer_types(extras, meta_types)
        typed = [typed_row(extra, types) for extra in extras]
    except FilterError as error:
        raise NearsightError(f"{path}: {error}") from None
    for row, label, name, meta in zip(rows, labels, names, typed, strict=True):
        row["label"] = label
        if row["class_name"] is None:
            row["class_name"] = name
        if meta:
            row["meta"] = meta
    return rows


def meta_types_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The column types of already typed metadata (``row["meta"]``): what a gallery stores and
    its chunks are read back with."""
    kinds: dict[str, set[str]] = {}
    for row in rows:
        for key, value in (row.get("meta") or {}).items():
            kinds.setdefault(key, set()).add(_value_kind(value))
    return {key: _column_kind(found) for key, found in kinds.items()}


def _value_kind(value: Any) -> str:
    if isinstance(value, IsoDateTime):
        return "datetime"
    if isinstance(value, IsoDate):
        return "date"
    return "str" if isinstance(value, str) else "float" if isinstance(value, float) else "int"


def _column_kind(found: set[str]) -> str:
    if found == {"date"}:
        return "date"
    if found <= {"date", "datetime"}:
        return "datetime"
    return "str" if found & {"str", "date", "datetime"} else "float" if "float" in found else "int"


def _load_npy(file: Path) -> np.ndarray:
    try:
        array = load_array(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise NearsightError(f"{file} is not a readable .npy file ({error})") from None
    if array.ndim != 2 or array.shape[1] == 0 or array.dtype.kind != "f":
        raise NearsightError(
            f"{file} should hold float [N, D] vectors, it holds {array.dtype} {array.shape}"
        )
    return array


def _read_csv(file: Path) -> list[dict[str, Any]]:
    try:
        with open(file, newline="", encoding="utf-8-sig") as handle:
            table = read_table(handle, str(file))  # its width checked before any row
            if not table.columns:  # labels are optional, a header is not
                raise NearsightError(f"{file} is empty: it needs a header row of column names")
            return [row for _, row in table.rows()]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot read meta file {file}: {reason}") from None


def _read_parquet(file: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        extra = EXTRA_MODULES["pyarrow"]
        raise NearsightError(
            f"reading {file} needs pyarrow, which comes with nearsight's [{extra}] extra: "
            f"pip install 'nearsight[{extra}]' (or give the meta as .csv)"
        ) from None
    try:
        table = parquet.read_table(file)
    except Exception as error:  # pyarrow raises its own types for damaged files
        raise NearsightError(f"cannot read meta file {file}: {error}") from None
    rows = table.to_pylist()
    for row in rows:  # a list cell (a tag column's): its tags as --list-column reads them
        for key, value in row.items():
            if isinstance(value, list):
                row[key] = stored_cell(value, key)
    return rows


def _clean(row: dict[str, Any], file: Path, number: int) -> dict[str, Any]:
    """A catalog row: known fields only, integers parsed, empty cells as None."""
    clean: dict[str, Any] = {}
    for key in META_FIELDS:
        value = row.get(key)
        if value is None or (isinstance(value, str) and value.strip() == ""):
            clean[key] = None
            continue
        if key in _INTEGER_FIELDS and key != "label":  # labels: integers or class names
            try:
                value = int(float(value)) if isinstance(value, str) else int(value)
            except (TypeError, ValueError):
                raise NearsightError(
                    f"{file}: row {number + 1} has {key} {value!r}, not an integer"
                ) from None
        clean[key] = value
    if clean["path"] is None:
        clean["path"] = f"{file.name}#{number}"  # the catalog wants a name for every item
    clean["meta"] = {  # typed by whole column in read_meta
        str(key): value
        for key, value in row.items()
        if key and key not in META_FIELDS and key not in BUILTIN_KEYS
    }
    return clean
