"""``nearsight eval``: the papers' retrieval metrics on a gallery's stored embeddings."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="Recall@k, NMI and MAP@R of a gallery (leave-one-out, the papers' protocol)",
        description="Evaluate a gallery by the deep-metric-learning protocol: every labelled "
        "item queries all the other labelled items, using the embeddings stored in the gallery "
        "(nothing is re-embedded). Recall@k, NMI (k-means, k = number of classes) and MAP@R.",
    )
    parser.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    parser.add_argument(
        "--k",
        type=int,
        nargs="+",
        metavar="K",
        help="Recall@k values (default 1 2 4 8; 1 10 100 1000 for a gallery of the sop dataset)",
    )
    parser.add_argument(
        "--queries",
        type=int,
        metavar="N",
        help="score a random sample of N labelled items as queries (fixed seed), each still "
        "searching all the others exactly: Recall@k and MAP@R estimates at N/items of the "
        "O(items^2) cost, for large galleries; NMI still clusters every item (default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    import warnings

    from nearsight.index.searchable import open_gallery
    from nearsight.index.vector_store import ApproximateVectorsWarning

    with open_gallery(args.gallery) as gallery, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ApproximateVectorsWarning)
        metrics = gallery.evaluate(args.k, args.queries)
    for warning in caught:  # one line: vectors decoded from PQ codes (no embeddings.npy)
        if issubclass(warning.category, ApproximateVectorsWarning):
            print(f"nearsight: note: {warning.message}", file=sys.stderr)
    if args.json:
        # MAP@R is NaN when no class has two items: null keeps the output valid JSON
        print(json.dumps({key: _json_number(value) for key, value in metrics.items()}))
        return 0
    shown = "  ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name != "queries")
    print(f"{shown}  ({metrics['queries']} queries)")
    return 0


def _json_number(value: float | int) -> float | int | None:
    return None if isinstance(value, float) and not math.isfinite(value) else value
