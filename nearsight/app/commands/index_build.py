"""``nearsight index build``: the command line of :func:`nearsight.index.gallery.build.
build_gallery` (chunks, resume and torchrun shards live there)."""

from __future__ import annotations

import argparse


def run_build(args: argparse.Namespace) -> int:
    from nearsight.data.decode_box import trusting

    with trusting(args.trusted_images):  # the operator vouches for these files
        return _run_build(args)


def _run_build(args: argparse.Namespace) -> int:
    from nearsight.app.commands.catalog_options import (
        check_group_column,
        declared_types,
        record_group_column,
    )
    from nearsight.app.commands.model_options import load_index_model
    from nearsight.core.errors import NearsightError
    from nearsight.index.gallery.build import build_gallery
    from nearsight.index.gallery.sources import dataset_source, images_source, list_source

    if args.dataset is not None:
        if args.root is None:
            raise NearsightError("--root is required with --dataset (the dataset folder)")
        source = dataset_source(args.dataset, args.root, args.split, declared_types(args))
        check_declared_columns(args.meta_types, source.fields)
    elif args.root is not None:
        raise NearsightError("--root goes with --dataset, not with --images or --list")
    elif args.images is not None:
        folders = [str(path) for path in args.images if path.is_dir()]
        if folders:
            raise NearsightError(
                f"--images takes image files; {folders[0]} is a folder (use --dataset folder "
                f"--root {folders[0]} for a folder of class folders, or --list FILE)"
            )
        source = images_source(args.images)
    else:
        source = list_source(args.list)
    check_group_column(args.group_column, source.fields, args.list_column)
    embedder = load_index_model(args)  # a timm:NAME model: its exported ONNX file
    report = build_gallery(
        embedder,
        source,
        args.out,
        model_path=embedder.path,
        index_type=args.index_type,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        workers=args.workers,
        key_column=args.key_column,
        list_columns=args.list_column or [],
        max_index_memory=args.max_index_memory,
        embeddings=args.embeddings,
        neighbour_graph=args.neighbour_graph,
    )
    record_group_column(args.group_column, report.out)
    print(report.summary())
    return 0


def check_declared_columns(meta_types: list[str] | None, fields: list[dict]) -> None:
    """A one-line error when ``--meta-types`` names a column the source does not have (a
    typo would otherwise be ignored)."""
    from nearsight.core.errors import NearsightError
    from nearsight.data.meta import parse_meta_types

    declared = parse_meta_types(meta_types)
    columns = {key for row in fields for key in (row.get("meta") or {})}
    unknown = [name for name in declared if name not in columns]
    if unknown:
        raise NearsightError(
            f"--meta-types {unknown[0]}=...: the source has no column {unknown[0]!r} (its "
            f"columns: {', '.join(sorted(columns)) or 'none'})"
        )
