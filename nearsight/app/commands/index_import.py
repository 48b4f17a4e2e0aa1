"""``nearsight index import`` (a gallery from vectors computed elsewhere) and ``nearsight
index compact`` (fold appended segments and removals into the base index)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from nearsight.app.commands.device_option import add_device_option


def register(actions: argparse._SubParsersAction, index_types: list[str]) -> None:
    from nearsight.app.commands.catalog_options import add_embeddings_option
    from nearsight.app.commands.model_options import add_foreign_model_options

    imported = actions.add_parser(
        "import",
        help="build a gallery from embeddings computed elsewhere",
        description="Build the gallery OUT from vectors (a .npy file, or a folder of chunks: "
        "NAME.npy files taken in name order, the format `index build` writes) and their catalog "
        "rows (a .csv or .parquet file with a 'label' column and optional 'path', 'class_name', "
        "'split'; or a folder of NAME.csv files). Vectors are L2-normalised. With --model the "
        "model's dim is checked against the vectors' and image search works; without one, the "
        "gallery is searched by --id or --vector and evaluated.",
    )
    imported.add_argument("--vectors", type=Path, required=True, help="FILE.npy or DIR")
    imported.add_argument("--meta", type=Path, required=True, help="FILE.csv, FILE.parquet or DIR")
    imported.add_argument("--out", type=Path, required=True, help="gallery folder to write")
    imported.add_argument("--model", type=Path, help="the model.onnx the vectors came from")
    imported.add_argument("--index-type", default="auto", choices=index_types)
    imported.add_argument(
        "--max-index-memory",
        help="memory budget of the index for --index-type auto, e.g. 2G (default: a quarter of RAM)",
    )
    add_device_option(imported)
    add_embeddings_option(imported)
    add_foreign_model_options(imported)
    imported.set_defaults(func=run_import)

    compact = actions.add_parser(
        "compact",
        help="fold added segments and removals into the gallery's base index",
        description="`index add` writes a segment file and `index remove` a catalog change; "
        "compact rewrites the gallery whole (index and embeddings) without them. `add` also "
        "compacts by itself once the segments hold a quarter of the gallery.",
    )
    compact.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    compact.add_argument(
        "--neighbour-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add (or with --no-neighbour-graph drop) the stored nearest-item lists that "
        "database-side augmentation reads (default: keep what the gallery has, rebuilt)",
    )
    compact.set_defaults(func=run_compact)


def run_import(args: argparse.Namespace) -> int:
    from nearsight.app.commands.catalog_options import (
        check_group_column,
        declared_types,
        record_group_column,
    )
    from nearsight.core.errors import NearsightError
    from nearsight.index.chunks import read_meta, read_vectors
    from nearsight.index.gallery.build import import_gallery
    from nearsight.index.gallery.sources import absolute_path, check_out_folder

    described = args.model_spec or args.input_size or args.mean or args.std or args.output
    if args.model is None and (described or args.resize):
        raise NearsightError("--input-size, --mean, --std, --resize, --output and --model-spec "
                             "describe the --model the vectors came from: give it too")  # fmt: skip
    check_out_folder(absolute_path(args.out))  # before reading what may be gigabytes
    vectors = read_vectors(args.vectors)
    rows = read_meta(args.meta, declared_types(args))
    if len(rows) != len(vectors):
        raise NearsightError(
            f"{args.meta} has {len(rows)} rows but {args.vectors} has {len(vectors)} vectors"
        )
    check_group_column(args.group_column, rows, args.list_column)
    embedder = None
    if args.model is not None:
        from nearsight.app.commands.model_options import load_index_model

        embedder = load_index_model(args)
    report = import_gallery(
        vectors,
        rows,
        args.out,
        vectors_path=args.vectors,
        embedder=embedder,
        model_path=embedder.path if embedder is not None else None,  # timm:NAME: its export
        index_type=args.index_type,
        key_column=args.key_column,
        list_columns=args.list_column or [],
        max_index_memory=args.max_index_memory,
        embeddings=args.embeddings,
        neighbour_graph=args.neighbour_graph,
    )
    record_group_column(args.group_column, report.out)
    print(
        f"imported gallery {report.out}: {report.items} items, {report.index_type} index, dim "
        f"{report.dim}{'' if args.model else ', no model'}, in {report.seconds:.1f}s"
    )
    return 0


def run_compact(args: argparse.Namespace) -> int:
    from nearsight.index.gallery.core import Gallery

    start = time.perf_counter()
    with Gallery.open(args.gallery) as gallery:
        segments = len(gallery.meta.get("segments", []))
        removed = len(gallery.meta.get("removed", []))
        gallery.compact(neighbour_graph=args.neighbour_graph)
        total = len(gallery)
    print(
        f"compacted {args.gallery}: {segments} segments and {removed} removals folded in, "
        f"{total} items, in {time.perf_counter() - start:.1f}s"
    )
    return 0
