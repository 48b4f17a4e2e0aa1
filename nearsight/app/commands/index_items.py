"""``nearsight index add``, ``index remove`` and ``index show``: the command lines of
:mod:`nearsight.index.gallery.update`'s typed jobs (grow and shrink a gallery, by id or by key)
and of reading one item by its id or key."""

from __future__ import annotations

import argparse
import json


def run_add(args: argparse.Namespace) -> int:
    from nearsight.data.decode_box import trusting

    with trusting(args.trusted_images):  # the operator vouches for these files
        return _run_add(args)


def _run_add(args: argparse.Namespace) -> int:
    from nearsight.data.meta import parse_meta_entries, parse_meta_types
    from nearsight.index.gallery.update import add_images

    report = add_images(
        args.gallery,
        args.images,
        label=label_of(args.label),
        class_name=args.class_name,
        # text, typed by the gallery's columns; a typo is reported before the gallery opens
        meta=parse_meta_entries(args.meta, typed=False),
        key=args.key,
        meta_types=parse_meta_types(args.meta_types),
        model=args.model,
        device=args.device,
        batch_size=args.batch_size,
        workers=args.workers,
    )
    print(report.summary())
    return 0


def label_of(text: str | None) -> int | str | None:
    """``--label``: an integer label, or a class name."""
    if text is None:
        return None
    stripped = text.strip()
    return int(stripped) if stripped.lstrip("+-").isdigit() else stripped


def run_remove(args: argparse.Namespace) -> int:
    from nearsight.index.gallery.update import remove_items

    print(remove_items(args.gallery, ids=args.ids, keys=args.keys).summary())
    return 0


def run_show(args: argparse.Namespace) -> int:
    from nearsight.index.catalog.list_columns import listed_row
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.keys import item_of_key

    with Gallery.open(args.gallery) as gallery:
        row = (
            item_of_key(gallery, args.key) if args.key is not None else gallery.items([args.id])[0]
        )
        row = listed_row(row, gallery.meta)
    print(json.dumps(row, ensure_ascii=False))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.summary import gallery_summary

    with Gallery.open(args.gallery) as gallery:
        summary = gallery_summary(gallery)
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    print(f"gallery {args.gallery}")
    print(f"  items: {summary['items']} ({summary['labelled']} labelled, "
          f"{summary['classes']} classes)")  # fmt: skip
    print(f"  vectors: dim {summary['dim']}, {summary['metric']}, index {summary['index_type']}")
    print(f"  model: {summary['model']} (sha256 {summary['model_sha256'][:12]}..)")
    print(f"  key column: {summary['key_column'] or 'none'}")
    columns = ", ".join(f"{name} ({kind})" for name, kind in summary["columns"].items())
    print(f"  columns: {columns or 'none'}")
    if summary["dataset"]:
        print(f"  dataset: {summary['dataset']}, split {summary['split']}")
    print(f"  created: {summary['created']}")
    return 0
