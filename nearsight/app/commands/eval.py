"""``nearsight eval``: the papers' retrieval metrics on a gallery's stored embeddings."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nearsight.app.commands.rerank_option import add_rerank_option

if TYPE_CHECKING:
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.rerank.spec import RerankSpec


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
    add_rerank_option(parser)
    parser.add_argument(
        "--tune-on",
        type=Path,
        metavar="VAL_GALLERY",
        help="choose --rerank first: score a grid of re-rankings on VAL_GALLERY (a gallery of "
        "validation classes, never the test classes; same model) and keep the best MAP@R "
        "that does not lower Recall@1 (none if nothing helps)",
    )
    parser.add_argument(
        "--save",
        action="store_true",
        help="with --tune-on: store the choice in --gallery, so search, serve and eval use it "
        "by default",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    import warnings

    from nearsight.core.errors import NearsightError
    from nearsight.index.gallery.change import set_meta
    from nearsight.index.vector_store import ApproximateVectorsWarning
    from nearsight.search.route import resolve_rerank
    from nearsight.search.searcher import open_gallery

    if args.save and args.tune_on is None:
        raise NearsightError("--save stores what --tune-on chose: give --tune-on VAL_GALLERY")
    if args.tune_on is not None and args.rerank is not None:
        raise NearsightError("--rerank and --tune-on are alternatives: --tune-on chooses it")
    with open_gallery(args.gallery) as gallery, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ApproximateVectorsWarning)
        spec = args.rerank
        if args.tune_on is not None:
            spec = _tune(args.tune_on, gallery.gallery)
            if args.save:
                set_meta(gallery.gallery, rerank=str(spec), rerank_tuned_on=str(args.tune_on))
                print(f"nearsight: stored rerank {spec} in {args.gallery}", file=sys.stderr)
        spec = resolve_rerank(gallery.gallery, spec)
        metrics = gallery.evaluate(args.k, args.queries, spec)
        unlabelled = int((gallery.gallery.labels < 0).sum())
    for warning in caught:  # one line: vectors decoded from PQ codes (no embeddings.npy)
        if issubclass(warning.category, ApproximateVectorsWarning):
            print(f"nearsight: note: {warning.message}", file=sys.stderr)
    if args.json:
        # MAP@R is NaN when no class has two items: null keeps the output valid JSON
        numbers = {key: _json_number(value) for key, value in metrics.items()}
        print(json.dumps(numbers | {"rerank": str(spec), "unlabelled": unlabelled}))
        return 0
    shown = "  ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name != "queries")
    rerank = "" if not spec.active else f", rerank {spec}"
    left_out = f"; {unlabelled} unlabelled items left out" if unlabelled else ""
    print(f"{shown}  ({metrics['queries']} labelled items queried{left_out}{rerank})")
    return 0


def _tune(val_path: Path, test: Gallery) -> RerankSpec:
    """The re-ranking chosen on the validation gallery (its table printed to stderr)."""
    from nearsight.core.errors import NearsightError
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.evaluate import evaluate_gallery
    from nearsight.search.rerank.tune import tune

    with Gallery.open(val_path) as val:
        if val.model_sha256 != test.model_sha256:
            raise NearsightError(
                f"--tune-on {val_path} was embedded by another model than {test.path}: tune on "
                "a gallery of validation classes built with the same model"
            )
        if val.path == test.path:
            raise NearsightError("--tune-on must be a gallery of validation classes, not --gallery")
        print(f"{'rerank':<40} {'recall@1':>8} {'map@r':>8}  (on {val_path})", file=sys.stderr)

        def show(row) -> None:
            print(
                f"{str(row.spec):<40} {row.recall_at_1:8.4f} {row.map_at_r:8.4f}", file=sys.stderr
            )

        def score(spec: RerankSpec) -> dict[str, float | int]:
            return evaluate_gallery(val, (1,), rerank=spec, with_nmi=False)

        chosen, _ = tune(score, progress=show)
    print(f"nearsight: chose rerank {chosen}", file=sys.stderr)
    return chosen


def _json_number(value: float | int) -> float | int | None:
    return None if isinstance(value, float) and not math.isfinite(value) else value
