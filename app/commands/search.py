"""``nearsight search``: the nearest gallery items of one query image."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

JSON_KEYS = ("id", "path", "label", "class_name", "distance")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search",
        help="find the gallery images nearest to a query image",
        description="Embed IMAGE with the gallery's model (or --model, which must be the same "
        "model) and print its k nearest gallery items, nearest first. The distance is the "
        "Euclidean distance between the unit-length embeddings, sqrt(2 - 2 cos): 0 is the same "
        "direction, 2 the opposite.",
    )
    parser.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    parser.add_argument("image", type=Path, metavar="IMAGE", help="query image file")
    parser.add_argument("--k", type=int, default=8, help="neighbours to show (default 8)")
    parser.add_argument(
        "--json",
        action="store_true",
        help='print a JSON list of {"id", "path", "label", "class_name", "distance"}',
    )
    parser.add_argument("--model", type=Path, help="default: the model the gallery was built with")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.set_defaults(func=run_search)


def run_search(args: argparse.Namespace) -> int:
    from nearsight.index.searchable import open_gallery
    from nearsight.models.errors import NearsightError

    if args.k < 1:
        raise NearsightError(f"--k must be at least 1, got {args.k}")
    with open_gallery(args.gallery, args.model, device=args.device) as gallery:
        found = gallery.search(args.image, args.k)
    results = [{key: row[key] for key in JSON_KEYS} for row in found]
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{'rank':>4}  {'id':>8}  {'distance':>8}  {'label':>6}  class / path")
    for rank, row in enumerate(results, start=1):
        label = "-" if row["label"] is None else str(row["label"])
        name = f"{row['class_name']}  " if row["class_name"] else ""
        print(
            f"{rank:>4}  {row['id']:>8}  {row['distance']:>8.4f}  {label:>6}  {name}{row['path']}"
        )
    return 0
