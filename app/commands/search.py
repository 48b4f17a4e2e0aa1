"""``nearsight search``: the nearest gallery items of one query image."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


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
    parser.add_argument("image", type=Path, nargs="?", metavar="IMAGE", help="query image file")
    parser.add_argument(
        "--id", type=int, dest="item_id", help="query by a gallery item's stored vector instead"
    )
    parser.add_argument(
        "--vector", type=Path, help="query by a vector: a .npy file of D floats (or [1, D])"
    )
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
    from nearsight.app.commands.index import load_gallery_model
    from nearsight.index.gallery import Gallery
    from nearsight.index.images import load_image
    from nearsight.models.errors import NearsightError

    if args.k < 1:
        raise NearsightError(f"--k must be at least 1, got {args.k}")
    given = [name for name, value in (("IMAGE", args.image), ("--id", args.item_id),
                                      ("--vector", args.vector)) if value is not None]  # fmt: skip
    if len(given) != 1:
        raise NearsightError("give one query: IMAGE, --id ID or --vector FILE.npy")
    with Gallery.open(args.gallery) as gallery:
        if args.item_id is not None:
            query = _stored_vector(gallery, args.item_id)
        elif args.vector is not None:
            query = _vector_file(args.vector)
        else:
            image = load_image(args.image)  # a missing or unreadable query: one-line error
            embedder = load_gallery_model(gallery, args.model, args.device)
            query = embedder.embed_images([image])
        distances, ids = gallery.search(query, args.k)
        found = [(int(i), float(d)) for i, d in zip(ids[0], distances[0], strict=True) if i >= 0]
        rows = gallery.items([i for i, _ in found])
    results = [
        {
            "id": item["id"],
            "path": item["path"],
            "label": item["label"],
            "class_name": item["class_name"],
            "distance": distance if math.isfinite(distance) else None,
        }
        for item, (_, distance) in zip(rows, found, strict=True)
    ]
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


def _stored_vector(gallery, item_id: int):
    import numpy as np

    gallery.items([item_id])  # one-line error for an unknown id
    position = int(np.searchsorted(gallery.ids, item_id))
    return np.asarray(gallery.embeddings[position : position + 1], dtype=np.float32)


def _vector_file(path: Path):
    import numpy as np

    from nearsight.models.errors import NearsightError

    try:
        vector = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise NearsightError(f"cannot read query vector {path}: {error}") from None
    vector = np.asarray(vector, dtype=np.float32).reshape(1, -1)
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(vector).all() or norm == 0:
        raise NearsightError(f"query vector {path} is zero or not finite")
    return vector / norm
