"""Adding images to a gallery and removing items from it: the typed jobs that ``nearsight index
add`` / ``index remove`` and ``nearsight.add_images`` / ``remove_items`` run, as
:func:`nearsight.index.gallery.build.build_gallery` is the one builder.

Added items are typed as the gallery's columns are (catalog meta ``meta_types``, or as
declared for a new column); an item whose key the gallery holds is replaced (the new one is
added first: a crash in between leaves both, never neither). Unreadable images are listed on
stderr and left out, and duplicate images (the same bytes) noted, as a build does.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.embed import check_batching, embed_files
from nearsight.data.meta import FilterError, typed_row
from nearsight.index.catalog.list_columns import gallery_list_columns, stored_cell
from nearsight.index.chunks import meta_types_of
from nearsight.index.gallery.build import describe_files, report_unreadable
from nearsight.index.gallery.change import set_meta
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.defaults import DEFAULT_BATCH_SIZE
from nearsight.index.gallery.keys import duplicate_note, ids_of_keys, key_column, normal_key
from nearsight.index.gallery.sources import absolute_path

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.models.embedder import Embedder

PathLike = str | os.PathLike[str]
SHOWN_IDS = 10  # the summary lists this many new ids, then "..."


@dataclass(frozen=True)
class AddReport:
    """What :func:`add_images` did: the new items' ``ids`` (in the order of the readable
    images), the item a key ``replaced`` (its id) and the gallery's size after."""

    gallery: Path
    ids: list[int]
    items: int
    skipped: list[str]  # one line per unreadable image
    key: str | None
    replaced: int | None
    duplicates: str  # the duplicate-images note, empty when none
    seconds: float

    def summary(self) -> str:
        shown = ", ".join(map(str, self.ids[:SHOWN_IDS]))
        shown += ", ..." if len(self.ids) > SHOWN_IDS else ""
        swap = ""
        if self.replaced is not None:
            swap = f", replacing item {self.replaced} (key {self.key!r})"
        skipped = f", {len(self.skipped)} unreadable skipped" if self.skipped else ""
        return (
            f"added {len(self.ids)} items (ids {shown}){swap}{skipped} to {self.gallery}: "
            f"{self.items} items, in {self.seconds:.1f}s"
        )


@dataclass(frozen=True)
class RemoveReport:
    """What :func:`remove_items` did: the removed ``ids`` and the gallery's size after."""

    gallery: Path
    ids: list[int]
    items: int
    seconds: float

    def summary(self) -> str:
        return (
            f"removed {len(self.ids)} items from {self.gallery}: {self.items} items, "
            f"in {self.seconds:.1f}s"
        )


def add_images(
    gallery_dir: PathLike,
    images: Sequence[PathLike],
    *,
    label: int | str | None = None,
    class_name: str | None = None,
    meta: Mapping[str, Any] | None = None,
    key: str | None = None,
    meta_types: Mapping[str, str] | None = None,
    model: PathLike | Embedder | None = None,
    device: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = 0,
) -> AddReport:
    """Embed ``images`` (files) with the gallery's model and add them to the gallery at
    ``gallery_dir``. ``label``: their class, an integer label or a class name (the gallery's
    label of that name, else a new one); ``meta``: their extra columns, text or numbers, typed
    as the gallery's columns (``meta_types`` declares new ones); ``key``: the one image's key
    (an item with that key is replaced). ``model``: a path or a loaded embedder, checked to
    be the gallery's model (default: the one it records). ``workers``: decoding threads."""
    start = time.perf_counter()
    paths = [absolute_path(path) for path in images]
    if not paths:
        raise NearsightError("add_images: images is empty")
    check_batching(batch_size, workers)
    if key is not None:
        key = normal_key(key)
        if len(paths) != 1:
            raise NearsightError("a key names one item: give one image with it")
    raw = {str(name): value for name, value in (meta or {}).items()}
    with Gallery.open(gallery_dir) as gallery:
        typed, key, new_types = _added_meta(gallery, raw, key, meta_types or {})
        if key is not None and len(paths) != 1:  # a key given in meta
            raise NearsightError("a key names one item: give one image with it")
        label, class_name = _added_label(gallery, label, class_name)
        embedder = _embedder(gallery, model, device)
        result = embed_files(embedder, paths, batch_size=batch_size, workers=workers)
        report_unreadable(result.errors)
        kept = [int(i) for i in np.flatnonzero(result.ok)]
        if not kept:
            raise NearsightError(f"no image could be read (the first: {result.errors[0]})")
        kept_paths = [paths[i] for i in kept]
        described = describe_files(kept_paths, workers, result.sizes)
        extra = {"label": label, "class_name": class_name, "meta": typed}
        items = [
            {"path": str(path), **extra, **info}
            for path, info in zip(kept_paths, described, strict=True)
        ]
        replaced = ids_of_keys(gallery, [key]).get(key) if key is not None else None
        note = _duplicates(gallery, described, kept_paths, replaced)
        if note:
            print(f"nearsight: {note}", file=sys.stderr)
        if new_types:  # a new column's type is stored, so that later adds follow it
            stored = gallery.meta.get("meta_types") or {}
            set_meta(gallery, meta_types={**stored, **new_types})
        ids = gallery.add(result.embeddings, items)
        if replaced is not None:  # after the add: a crash between leaves both, never neither
            gallery.remove([replaced])
        total = len(gallery)
        folder = gallery.path
    return AddReport(gallery=folder, ids=ids, items=total, skipped=list(result.errors), key=key,
                     replaced=replaced, duplicates=note,
                     seconds=time.perf_counter() - start)  # fmt: skip


def remove_items(
    gallery_dir: PathLike,
    *,
    ids: Sequence[int] | None = None,
    keys: Sequence[str] | None = None,
) -> RemoveReport:
    """Remove the items ``ids``, or those whose key (the gallery's key column) is one of
    ``keys``, from the gallery at ``gallery_dir``: all of them, or (one unknown) none."""
    start = time.perf_counter()
    if (ids is None) == (keys is None):
        raise NearsightError("remove_items takes ids or keys, not both")
    wanted = list(ids if ids is not None else keys or [])
    if not wanted:
        raise NearsightError(f"remove_items: {'ids' if ids is not None else 'keys'} is empty")
    with Gallery.open(gallery_dir) as gallery:
        if keys is not None:
            found = ids_of_keys(gallery, [str(key) for key in wanted])
            unknown = [str(key) for key in wanted if str(key) not in found]
            if unknown:
                raise NearsightError(f"gallery {gallery.path} has no item with key {unknown[0]!r}")
            removed = sorted(set(found.values()))
        else:
            removed = sorted({_item_id(i) for i in wanted})
        gallery.remove(removed)
        total = len(gallery)
        folder = gallery.path
    return RemoveReport(gallery=folder, ids=removed, items=total,
                        seconds=time.perf_counter() - start)  # fmt: skip


def _item_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise NearsightError(f"an item id is a whole number, got {value!r}")
    return int(value)


def _embedder(gallery: Gallery, model: PathLike | Embedder | None, device: str) -> Embedder:
    """``model`` (a path, or an embedder already loaded) or the gallery's recorded model,
    checked to be the model the gallery was built with."""
    if model is None or isinstance(model, str | os.PathLike):
        return gallery.load_model(model, device=device)
    gallery.check_model(model)
    return model


def tag_cells(raw: dict[str, Any], tag_columns: Collection[str]) -> dict[str, Any]:
    """``raw`` with each tag column's value (a list, or ``a|b`` text) as the catalog stores
    it; a list given to a column of one value is an error."""
    cells = {}
    for name, value in raw.items():
        if name in tag_columns:
            cells[name] = stored_cell(value, name)
        elif isinstance(value, list | tuple):
            raise NearsightError(
                f"meta {name!r}: a list of values is for a tag column (--list-column at "
                "build); this column holds one value an item"
            )
        else:
            cells[name] = value
    return cells


def _added_meta(
    gallery: Gallery, raw: dict[str, Any], key: str | None, declared_types: Mapping[str, str]
) -> tuple[dict[str, Any], str | None, dict[str, str]]:
    """(typed metadata, key, types of new columns) of added items: typed as the gallery's
    columns are (or as declared for new columns), the key from ``key`` or the key column's
    entry of ``raw``. A declared type that differs from a stored column's is refused: the
    items already there keep theirs, so only a rebuild can change it."""
    column = key_column(gallery)
    if key is not None:
        if column is None:
            raise NearsightError(
                f"gallery {gallery.path} has no key column: build it with a 'key' column or "
                "--key-column NAME"
            )
        given = raw.get(column)
        if given is not None and str(given).strip() and str(given).strip() != str(key).strip():
            raise NearsightError(
                f"--key {str(key)[:80]!r} and --meta {column}={str(given)[:80]} name two keys "
                f"({column!r} is the key column): give the key once, with --key"
            )
        raw = {**raw, column: key}
    elif column is not None and column in raw and raw[column] is not None:
        raw = {**raw, column: normal_key(raw[column])}
    raw = tag_cells(raw, gallery_list_columns(gallery.meta))
    stored = dict(gallery.meta.get("meta_types") or {})
    declared = dict(declared_types)
    for name, kind in declared.items():
        if name in stored and stored[name] != kind:
            raise NearsightError(
                f"--meta-types {name}={kind}: the gallery's column '{name}' is "
                f"{stored[name]} (rebuild the gallery to change a column's type)"
            )
    types = {**stored, **declared}
    if column is not None:
        types[column] = "str"
    try:
        typed = typed_row(raw, types)
    except FilterError as error:
        raise NearsightError(str(error)) from None
    found = {**meta_types_of([{"meta": typed}]), **declared}
    new_types = {name: kind for name, kind in found.items() if name not in stored}
    found_key = typed.get(column) if column is not None else None
    return typed, None if found_key is None else str(found_key), new_types


def _added_label(
    gallery: Gallery, label: int | str | None, class_name: str | None
) -> tuple[int | None, str | None]:
    """(label, class name) of added items: an integer label as given, or a class name mapped
    to the gallery's label of that name (a new label, one past the largest, for a new name)."""
    if label is None:
        return None, class_name
    if isinstance(label, bool):
        raise NearsightError(f"a label is a whole number or a class name, got {label!r}")
    if isinstance(label, int | np.integer):
        return int(label), class_name
    name = str(label).strip()
    if not name:
        raise NearsightError("a label may not be empty")
    named = [number for number, known in gallery.class_names().items() if known == name]
    if named:
        return named[0], class_name or name
    largest = int(gallery.labels.max()) if len(gallery.labels) else -1
    return max(largest, -1) + 1, class_name or name


def _duplicates(
    gallery: Gallery, described: list[dict[str, Any]], paths: list[Path], replaced: int | None
) -> str:
    """The note on added images whose bytes repeat, or match an item's (not the replaced
    one's: replacing an item by the same photo is no duplicate)."""
    hashes = [info.get("sha256") for info in described]
    assert gallery._catalog is not None
    known = gallery._catalog.ids_by_sha256([h for h in hashes if h])
    if replaced is not None:
        known = {sha: i for sha, i in known.items() if i != replaced}
    return duplicate_note(hashes, [str(p) for p in paths], known)
