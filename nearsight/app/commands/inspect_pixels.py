"""``nearsight inspect duplicates`` and ``inspect explain``: the two inspections that read the
images themselves (a perceptual hash; the network's feature maps)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from nearsight.core.errors import NearsightError


def register_pixels(
    actions: argparse._SubParsersAction, add_gallery: Callable[[argparse.ArgumentParser], None]
) -> None:
    duplicates = actions.add_parser(
        "duplicates",
        help="pairs of items that are the same picture (equal bytes, resized, recompressed)",
        description="Find same-picture pairs: candidates are items closer in the embedding "
        "than a threshold chosen from the gallery's own distances (the 1% quantile of random "
        "pairs; printed), each confirmed on the pixels by a perceptual hash; items with equal "
        "bytes always pair. With --against, pairs across the two galleries (same model).",
    )
    add_gallery(duplicates)
    duplicates.add_argument(
        "--against", type=Path, metavar="GALLERY", help="find copies of its items in --gallery"
    )
    duplicates.add_argument(
        "--threshold", type=float, metavar="D", help="candidate distance (default: chosen)"
    )
    duplicates.add_argument(
        "--hash-distance", type=int, default=8, metavar="BITS",
        help="pHash bits (of 64) a copy may differ by (default 8)",
    )  # fmt: skip
    duplicates.add_argument("--json", action="store_true", help="print one JSON object")
    duplicates.set_defaults(func=run_duplicates)

    explain = actions.add_parser(
        "explain",
        help="where in two images their similarity comes from (CNNs with average pooling)",
        description="Draw two gallery items side by side, each location of the network's "
        "last feature map tinted by its share of the pair's similarity (the shares sum to "
        "the similarity). Needs torch and the checkpoint: the gallery's model when it is "
        "one, else --checkpoint (or a .pt beside the ONNX model that it was exported from).",
    )
    add_gallery(explain)
    explain.add_argument(
        "--id", type=int, action="append", required=True, metavar="N",
        help="an item id; give two (--id A --id B)",
    )  # fmt: skip
    explain.add_argument("--out", type=Path, required=True, help="the PNG file to write")
    explain.add_argument("--checkpoint", type=Path, help="the model's checkpoint (.pt)")
    explain.set_defaults(func=run_explain)


def run_duplicates(args: argparse.Namespace) -> int:
    from nearsight.app.commands.inspect_output import print_json, print_table, records
    from nearsight.search.inspect.duplicates import find_duplicates

    if args.hash_distance < 0 or args.hash_distance > 64:
        raise NearsightError(f"--hash-distance is 0 to 64 bits, got {args.hash_distance}")
    if args.threshold is not None and not 0 <= args.threshold <= 2:
        raise NearsightError(f"--threshold is a distance from 0 to 2, got {args.threshold}")
    found = find_duplicates(
        args.gallery, args.against, threshold=args.threshold, hash_distance=args.hash_distance
    )
    if args.json:
        print_json(found.summary() | {"pairs": records(found.pairs)})
        return 0
    unreadable = f", {found.unreadable} unreadable" if found.unreadable else ""
    print(
        f"threshold {found.threshold:.4f} (embedding distance): {found.candidates} candidate "
        f"pairs, {found.confirmed} confirmed on the pixels{unreadable}"
    )
    print_table(found.pairs[["a_id", "a_key", "a_path", "b_id", "b_key", "b_path", "distance",
                             "hash_bits", "same_bytes"]], every="--json")  # fmt: skip
    return 0


def run_explain(args: argparse.Namespace) -> int:
    from nearsight.search.inspect.explain import draw, explain_pair

    if len(args.id) != 2:
        raise NearsightError(f"give two items: --id A --id B (got {len(args.id)})")
    explanation = explain_pair(args.gallery, args.id[0], args.id[1], args.checkpoint)
    draw(explanation, args.out)
    maps = explanation.maps
    print(
        f"wrote {args.out}: similarity {maps.similarity:.4f}, maps of "
        f"{maps.map_a.shape[0]}x{maps.map_a.shape[1]} locations summing to "
        f"{maps.map_a.sum():.4f} and {maps.map_b.sum():.4f}"
    )
    return 0
