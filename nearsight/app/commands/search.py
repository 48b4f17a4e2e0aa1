"""``nearsight search``: the nearest gallery items of a query image, of a gallery item, or of
every image of a folder or list (one JSON line per query)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from nearsight.app.commands.device_option import add_device_option
from nearsight.app.commands.rerank_option import add_rerank_option
from nearsight.core.arrays import load_array
from nearsight.search.checks import DEFAULT_K


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search",
        help="find the gallery images nearest to a query image",
        description="Embed IMAGE with the gallery's model (or --model, which must be the same "
        "model) and print its k nearest gallery items, nearest first; or those of gallery item "
        "--id N or --key K (itself first, at distance 0), or of a --vector; or, with --queries, "
        "of every image of a "
        "folder or list, "
        "written as one JSON line per query to --out. The distance is the Euclidean distance "
        "between the unit-length embeddings, sqrt(2 - 2 cos): 0 is the same direction, 2 the "
        "opposite.",
    )
    parser.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("image", type=Path, nargs="?", metavar="IMAGE", help="query image file")
    source.add_argument(
        "--id", type=int, metavar="N", help="query by gallery item N's stored vector"
    )
    source.add_argument(
        "--key",
        metavar="K",
        help="query by the item with key K (the gallery's key column, e.g. a SKU)",
    )
    source.add_argument(
        "--vector", type=Path, help="query by a vector: a .npy file of D floats (or [1, D])"
    )
    source.add_argument(
        "--queries",
        type=Path,
        metavar="DIR_OR_LIST",
        help="a folder of images (searched recursively) or a text file with one image path per "
        "line; needs --out",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE.jsonl|FILE.csv",
        help='with --queries: FILE.jsonl, one line per query, {"query": PATH, "neighbours": '
        '[...]} (or "groups") or {"query": PATH, "error": "..."}; FILE.csv, one row per '
        "neighbour (query, rank, id, key, path, label, class_name, distance, a group column "
        "when grouped, then the metadata columns; an unreadable query: one row with its error)",
    )
    parser.add_argument("--k", type=int, default=DEFAULT_K,
                        help=f"neighbours to show (default {DEFAULT_K})")  # fmt: skip
    parser.add_argument(
        "--offset",
        type=int,
        default=0,
        metavar="N",
        help="a page: ranks N+1 to N+k of the search of N+k (default 0); with --group-by, "
        "groups N+1 to N+k",
    )
    parser.add_argument(
        "--group-by",
        nargs="?",
        const="",
        metavar="COL",
        help="at most k groups of items holding one value of COL (a product's SKU), ordered by "
        "their best distance, each with its best --group-size items; items without a value "
        "are left out. Without COL: the column the gallery records (index build/import "
        '--group-column). --json prints [{"value", "count", "neighbours"}]',
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=1,
        metavar="N",
        help="with --group-by: the best N items of each group (default 1)",
    )
    parser.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="search only items that match (repeatable; all must hold): KEY=VALUE, KEY!=VALUE, "
        "KEY>=V, KEY>V, KEY<=V, KEY<V (numbers or ISO dates), KEY= (no value) over metadata "
        "columns and label, class_name, split; a value no item holds gets a note on stderr",
    )
    parser.add_argument(
        "--max-filter-conditions",
        type=int,
        default=None,
        help="distinct --filter conditions allowed (default 32; repeats count once)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print a JSON list of {"id", "path", "label", "class_name", "distance", "meta"}',
    )
    add_rerank_option(parser)
    parser.add_argument("--model", type=Path, help="default: the model the gallery was built with")
    add_device_option(parser)
    parser.add_argument(
        "--batch-size", type=int, default=32, help="with --queries: images per batch (default 32)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="with --queries: image-decoding worker processes (default min(2, cores))",
    )
    parser.set_defaults(func=run_search)


def run_search(args: argparse.Namespace) -> int:
    from nearsight.core.errors import NearsightError
    from nearsight.data.embed import check_batching
    from nearsight.index.catalog.filters import merge_conditions, parse_filters
    from nearsight.search.checks import check_k, check_offset

    check_k(args.k)
    check_offset(args.offset)
    if args.group_by is None and args.group_size != 1:
        raise NearsightError("--group-size goes with --group-by (the column to group by)")
    if (args.queries is None) != (args.out is None):
        raise NearsightError("--queries and --out go together")
    if args.out is not None and args.out.suffix.lower() not in (".jsonl", ".csv"):
        raise NearsightError(f"--out {args.out}: write FILE.jsonl (JSON lines) or FILE.csv")
    check_batching(args.batch_size, args.workers)
    # a bad filter fails before the model loads
    conditions = merge_conditions(parse_filters(args.filter), args.max_filter_conditions)
    if args.queries is not None:
        return _run_batch(args, conditions)
    results = _search_one(args, conditions)
    if args.json:
        print(json.dumps(results, ensure_ascii=False))
        return 0
    if args.group_by is not None:
        for group in results:
            print(f"{group['value']}  ({group['count']} items)")
            _print_table(group["neighbours"])
        return 0
    _print_table(results)
    return 0


def _search_one(args: argparse.Namespace, conditions: list) -> list[dict[str, Any]]:
    from nearsight.data.decode_box import shared_box
    from nearsight.search.searcher import open_gallery

    if args.image is not None:
        shared_box(1)  # the query file is decoded there: its worker starts while the model loads
    # one query per process: the lighter onnxruntime session (docs/decisions.md)
    with open_gallery(
        args.gallery, args.model, device=args.device, optimization="extended"
    ) as gallery:
        found = gallery.run(search_request(gallery, args, conditions))
    # a filter value no item holds, what the route says of its answer (a recall it can't promise)
    for line in found.notes:
        print(f"nearsight: note: {line}", file=sys.stderr)
    if found.groups is not None:
        return [group.as_json() for group in found.groups]
    return [neighbour.as_json() for neighbour in found]


def _page(searcher, args: argparse.Namespace) -> dict[str, Any]:
    """The page the flags ask for, as the Python API's keyword arguments."""
    group_by = args.group_by
    if group_by == "":  # --group-by alone: the gallery's recorded column
        from nearsight.core.errors import NearsightError

        group_by = searcher.group_column
        if group_by is None:
            raise NearsightError("--group-by: the gallery records no group column; name one, "
                                 "--group-by COL")  # fmt: skip
    return {"offset": args.offset, "group_by": group_by, "group_size": args.group_size}


def search_request(searcher: Any, args: argparse.Namespace, conditions: list | None = None):
    """The search the flags ask for, as one SearchRequest (nearsight.search.request): the
    query (IMAGE, --id, --key or --vector; an ImageQuery of nothing for --queries, whose
    images are read in batches), k, the filters (``conditions``: the --filter flags parsed
    already), --rerank and the page."""
    from nearsight.search.request import (
        ImageQuery,
        ItemQuery,
        KeyQuery,
        Query,
        SearchRequest,
        VectorQuery,
    )

    query: Query
    if args.id is not None:
        query = ItemQuery(args.id)
    elif args.key is not None:
        query = KeyQuery(args.key)
    elif args.vector is not None:
        query = VectorQuery(_vector_file(args.vector, searcher.gallery.dim))
    else:
        query = ImageQuery(None if args.queries is not None else args.image)
    filters = args.filter if conditions is None else conditions
    return SearchRequest(query, args.k, filters or None, args.rerank, **_page(searcher, args))


def _vector_file(path: Path, dim: int):
    """The one query vector of a .npy file: [D] or [1, D] floats (a one-line error naming the
    file's shape and the gallery's D otherwise)."""
    import numpy as np

    from nearsight.core.errors import NearsightError

    try:
        vector = load_array(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise NearsightError(f"cannot read query vector {path}: {error}") from None
    shape = tuple(vector.shape)
    if vector.dtype.kind not in "fiu" or shape not in ((dim,), (1, dim)):
        several = len(shape) == 2 and shape[0] != 1
        rows = f"{shape[0]} vectors" if several else f"{vector.size} numbers"
        raise NearsightError(
            f"--vector {path} holds {vector.dtype} {shape}: {rows}; search takes one vector of "
            f"the gallery's dim, a [{dim}] or [1, {dim}] array of floats (several: search_many "
            "in Python, or --queries)"
        )
    return np.asarray(vector, dtype=np.float32).reshape(1, -1)


def _print_table(results: list[dict[str, Any]]) -> None:
    from nearsight.index.catalog.list_columns import cell_text

    meta_keys = sorted({key for row in results for key in row["meta"]})
    print(f"{'rank':>4}  {'id':>8}  {'distance':>8}  {'label':>6}  class / path")
    for row in results:
        label = "-" if row["label"] is None else str(row["label"])
        name = f"{row['class_name']}  " if row["class_name"] else ""
        distance = "-" if row["distance"] is None else f"{row['distance']:.4f}"
        meta = "  ".join(
            f"{key}={cell_text(row['meta'][key])}" for key in meta_keys if key in row["meta"]
        )
        print(
            f"{row['rank']:>4}  {row['id']:>8}  {distance:>8}  {label:>6}  {name}{row['path']}"
            + (f"  [{meta}]" if meta else "")
        )


# -- batch -----------------------------------------------------------------------------------


def query_paths(source: Path) -> list[Path]:
    """The images of a folder (recursively, by extension, sorted) or of a list file."""
    from nearsight.core.errors import NearsightError
    from nearsight.data.datasets.base import IMAGE_EXTENSIONS
    from nearsight.index.gallery.sources import absolute_path, list_source

    if source.is_dir():
        paths = sorted(
            absolute_path(path)
            for path in source.rglob("*")
            if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()
        )
        if not paths:
            raise NearsightError(f"{source} holds no image files")
        return paths
    if not source.exists():
        raise NearsightError(f"--queries {source}: no such folder or file")
    return list_source(source).paths


def _with_stage(stage):
    """The gallery's stage model as an embedder whose rows are [embedding | stage features]
    (what embed_files runs: one model call per batch gives both)."""
    import types

    import numpy as np

    def embed(images):
        return np.concatenate(stage.embed_with_stage(images), axis=1)

    return types.SimpleNamespace(embed=embed, image_size=stage.image_size, resize=stage.resize,
                                 spec=stage.spec)  # fmt: skip


def _run_batch(args: argparse.Namespace, conditions: list) -> int:
    import numpy as np

    from nearsight.app.commands.index import load_gallery_model
    from nearsight.core.atomic import atomic_file
    from nearsight.core.digest import file_sha256
    from nearsight.data.embed import embed_files
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.answer import search_vectors
    from nearsight.search.route import apply_conditions
    from nearsight.search.searcher import Searcher

    paths = query_paths(args.queries)
    with Gallery.open(args.gallery) as gallery:
        # the terms checked once for every query, before the model loads
        checked = Searcher(gallery).check(search_request(Searcher(gallery), args, conditions))
        page = checked.page
        searcher = Searcher(gallery, load_gallery_model(gallery, args.model, args.device))
        filtered = apply_conditions(gallery, checked.conditions)
        for note in filtered.notes:
            print(f"nearsight: note: {note}", file=sys.stderr)
        # a re-ranker of stage features: one run of the stage model gives both
        stage = checked.reranker.stage_model(searcher.embedder)
        result = embed_files(
            searcher.embedder if stage is None else _with_stage(stage), paths,
            batch_size=args.batch_size, workers=args.workers, desc="searching",
        )  # fmt: skip
        side = None
        if stage is not None:  # [embedding | stage features] per row, split
            side = np.ascontiguousarray(result.embeddings[:, gallery.dim :])
            result.embeddings = result.embeddings[:, : gallery.dim]
        ok = np.asarray(result.ok)
        # a query file with a gallery item's bytes is searched as that item, as `search IMAGE`
        read = [path for path, readable in zip(paths, ok, strict=True) if readable]
        twins = [searcher.identical_item(file_sha256(path)) for path in read]
        vectors = np.array(result.embeddings, dtype=np.float32)
        for row, twin in enumerate(twins):
            if twin is not None:
                vectors[row] = searcher.item_vector(twin)
        found = search_vectors(searcher, checked, vectors, filtered, twins,
                               side) if read else []  # fmt: skip
        answers = [[hit.as_json() for hit in row] for row in found]
    good = iter(answers)
    errors = iter(result.errors)  # in the order of the unreadable paths
    entries: list[dict[str, Any]] = []
    for path, readable in zip(paths, ok, strict=True):
        entry: dict[str, Any] = {"query": str(path)}
        if readable:
            entry["groups" if page.group_by else "neighbours"] = next(good)
        else:
            entry["error"] = next(errors)
        entries.append(entry)
    try:
        with atomic_file(args.out, "w") as handle:  # never a half-written results file
            if args.out.suffix.lower() == ".csv":
                write_csv(handle, entries)
            else:
                handle.writelines(json.dumps(entry) + "\n" for entry in entries)
    except OSError as error:
        reason = error.strerror or str(error)
        raise OSError(f"cannot write {args.out}: {reason}") from None
    unreadable = len(result.errors)
    note = f", {unreadable} unreadable (their lines hold the error)" if unreadable else ""
    print(f"searched {len(paths)} queries{note}: {args.out}", file=sys.stderr)
    return 0


def write_csv(handle: Any, entries: list[dict[str, Any]]) -> None:
    """The batch's answers as CSV: one row per neighbour (a ``group`` column holding its
    group's value when grouped), the metadata columns after the fixed ones (a tag column's
    tags as ``a|b``), an unreadable
    query as one row with its ``error``."""
    import csv

    from nearsight.index.catalog.list_columns import cell_text
    from nearsight.search.neighbour import FIELDS

    rows: list[dict[str, Any]] = []
    for entry in entries:
        if "error" in entry:
            rows.append({"query": entry["query"], "error": entry["error"]})
            continue
        hits = [(None, hit) for hit in entry.get("neighbours", [])]
        hits += [(g["value"], hit) for g in entry.get("groups", []) for hit in g["neighbours"]]
        for value, hit in hits:
            row = {"query": entry["query"], **({"group": value} if "groups" in entry else {})}
            row |= {name: hit[name] for name in FIELDS if name != "meta"}
            rows.append(row | {f"meta.{key}" if key in row else key: cell_text(v)
                               for key, v in hit["meta"].items()})  # fmt: skip
    fixed = ["query", *(["group"] if any("group" in row for row in rows) else []),
             *(name for name in FIELDS if name != "meta")]  # fmt: skip
    extra = sorted({key for row in rows for key in row} - {*fixed, "error"})
    errors = ["error"] if any("error" in row for row in rows) else []
    writer = csv.DictWriter(handle, [*fixed, *extra, *errors], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
