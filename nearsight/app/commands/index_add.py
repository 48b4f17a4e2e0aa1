"""``nearsight index add`` and ``index remove``: grow and shrink a gallery, by id or by key."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def run_add(args: argparse.Namespace) -> int:
    import numpy as np

    from nearsight.app.commands.index import load_gallery_model
    from nearsight.core.errors import NearsightError
    from nearsight.data.meta import parse_meta_entries
    from nearsight.index.embed import check_batching, embed_files
    from nearsight.index.gallery.build import describe_files, report_unreadable
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.keys import duplicate_note, ids_of_keys
    from nearsight.index.gallery.sources import absolute_path
    from nearsight.index.gallery.write import set_meta

    start = time.perf_counter()
    check_batching(args.batch_size, args.workers)
    raw = parse_meta_entries(args.meta, typed=False)  # a typo is reported before the gallery opens
    if args.key is not None and len(args.images) != 1:
        raise NearsightError("--key names one item: give one image with it")
    with Gallery.open(args.gallery) as gallery:
        meta, key, new_types = _added_meta(gallery, raw, args)
        if key is not None and len(args.images) != 1:  # a key given with --meta
            raise NearsightError("a key names one item: give one image with it")
        label, class_name = _added_label(gallery, args.label, args.class_name)
        embedder = load_gallery_model(gallery, args.model, args.device)
        paths = [absolute_path(path) for path in args.images]
        result = embed_files(embedder, paths, batch_size=args.batch_size, workers=args.workers)
        report_unreadable(result.errors)
        vectors, errors = result.embeddings, result.errors
        kept = [int(i) for i in np.flatnonzero(result.ok)]
        if not kept:
            raise NearsightError(f"no image could be read (the first: {errors[0]})")
        kept_paths = [paths[i] for i in kept]
        described = describe_files(kept_paths, args.workers)
        extra = {"label": label, "class_name": class_name, "meta": meta}
        items = [
            {"path": str(path), **extra, **info}
            for path, info in zip(kept_paths, described, strict=True)
        ]
        replaced = ids_of_keys(gallery, [key]).get(key) if key is not None else None
        hashes = [info.get("sha256") for info in described]
        assert gallery._catalog is not None
        known = gallery._catalog.ids_by_sha256([h for h in hashes if h])
        if replaced is not None:
            known = {sha: i for sha, i in known.items() if i != replaced}
        note = duplicate_note(hashes, [str(p) for p in kept_paths], known)
        if new_types:  # a new column's type is stored, so that later adds follow it
            stored = gallery.meta.get("meta_types") or {}
            set_meta(gallery, meta_types={**stored, **new_types})
        ids = gallery.add(vectors, items)
        args.added_ids = ids  # nearsight.add_images returns them
        if replaced is not None:  # after the add: a crash between leaves both, never neither
            gallery.remove([replaced])
        total = len(gallery)
    shown = ", ".join(map(str, ids[:10])) + (", ..." if len(ids) > 10 else "")
    swap = f", replacing item {replaced} (key {key!r})" if replaced is not None else ""
    skipped = f", {len(errors)} unreadable skipped" if errors else ""
    print(
        f"added {len(ids)} items (ids {shown}){swap}{skipped} to {args.gallery}: "
        f"{total} items, in {time.perf_counter() - start:.1f}s"
    )
    if note:
        print(f"nearsight: {note}", file=sys.stderr)
    return 0


def _added_meta(gallery: Any, raw: dict[str, str], args: argparse.Namespace):
    """(typed metadata, key, types of new columns) of added items: typed as the gallery's
    columns are (or as declared for new columns), the key from --key or the key column's
    --meta entry. A declared type that differs from a stored column's is refused: the items
    already there keep theirs, so only a rebuild can change it."""
    from nearsight.core.errors import NearsightError
    from nearsight.data.meta import FilterError, parse_meta_types, typed_row
    from nearsight.index.chunks import meta_types_of
    from nearsight.index.gallery.keys import key_column

    column = key_column(gallery)
    if args.key is not None:
        if column is None:
            raise NearsightError(
                f"gallery {args.gallery} has no key column: build it with a 'key' column or "
                "--key-column NAME"
            )
        raw = {**raw, column: args.key}
    stored = dict(gallery.meta.get("meta_types") or {})
    declared = parse_meta_types(args.meta_types)
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
        meta = typed_row(raw, types)
    except FilterError as error:
        raise NearsightError(str(error)) from None
    found = {**meta_types_of([{"meta": meta}]), **declared}
    new_types = {name: kind for name, kind in found.items() if name not in stored}
    key = meta.get(column) if column is not None else None
    return meta, None if key is None else str(key), new_types


def _added_label(gallery: Any, label: str | None, class_name: str | None):
    """(label, class name) of added items: an integer label as given, or a class name mapped
    to the gallery's label of that name (a new label, one past the largest, for a new name)."""
    if label is None:
        return None, class_name
    text = label.strip()
    if text.lstrip("+-").isdigit():
        return int(text), class_name
    named = [number for number, name in gallery.class_names().items() if name == text]
    if named:
        return named[0], class_name or text
    largest = int(gallery.labels.max()) if len(gallery.labels) else -1
    return max(largest, -1) + 1, class_name or text


def run_remove(args: argparse.Namespace) -> int:
    from nearsight.core.errors import NearsightError
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.keys import ids_of_keys

    start = time.perf_counter()
    with Gallery.open(args.gallery) as gallery:
        ids = args.ids
        if args.keys is not None:
            found = ids_of_keys(gallery, args.keys)
            unknown = [key for key in args.keys if key not in found]
            if unknown:
                raise NearsightError(f"gallery {args.gallery} has no item with key {unknown[0]!r}")
            ids = list(found.values())
        gallery.remove(ids)
        total = len(gallery)
    count = len(set(ids))
    print(
        f"removed {count} items from {args.gallery}: {total} items, "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return 0
