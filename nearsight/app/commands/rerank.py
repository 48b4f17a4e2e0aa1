"""``nearsight rerank train``: fit the pairwise re-ranker that ``--rerank pairwise:model=FILE``
runs, on a dataset's training split embedded by the gallery's model."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from nearsight.search.rerank.spec import MAX_DEPTH

DATASETS = ("cub", "cars", "sop", "folder", "csv")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rerank", help="train a learned pairwise re-ranker (--rerank pairwise:model=FILE)"
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    train = verbs.add_parser(
        "train",
        help="fit a re-ranker on a training split's embeddings and export it to ONNX",
        description="Embed the training split of --dataset with --model, hold out some of its "
        "classes, and fit a small scorer of (query, candidate) pairs on the others: each item "
        "queries the rest, its --depth nearest are its candidates, each pair labelled "
        "same-class or not. The feature set and the epoch are chosen on the held-out classes "
        "by leave-one-out Recall@1 (each held-out item queries the others), each fitted with "
        "--seeds seeds; the trained scorer is kept only when it beats plain search there by "
        "more than its spread across the seeds, else the file keeps the base order and says "
        "so. The test classes are never read. The ONNX file records the model it was trained "
        "for: galleries of other models refuse it.",
    )
    train.add_argument("--model", type=Path, required=True, help="the embedding model (.onnx)")
    train.add_argument("--dataset", choices=DATASETS, required=True)
    train.add_argument("--root", type=Path, required=True, help="dataset folder (or parent)")
    train.add_argument("--out", type=Path, required=True, help="the re-ranker .onnx to write")
    train.add_argument(
        "--depth", type=int, default=20, help="candidates per query, as searches re-rank them "
        "(default 20)",
    )  # fmt: skip
    train.add_argument(
        "--held-out", type=float, default=0.2,
        help="share of the training classes held out to choose the epoch (default 0.2, at "
        "least 2 classes)",
    )  # fmt: skip
    train.add_argument("--epochs", type=int, default=30, help="default 30")
    train.add_argument("--seed", type=int, default=0, help="the class split's and first fit's")
    train.add_argument(
        "--seeds", type=int, default=3,
        help="fits per feature set; a lift must exceed their spread (default 3)",
    )  # fmt: skip
    train.add_argument(
        "--list-features-only", action="store_true",
        help="score pairs by their list features only (ranks, similarities, the candidates' "
        "agreement), without the embeddings' elementwise products and differences (default: "
        "both feature sets are tried, and the held-out classes choose)",
    )  # fmt: skip
    train.add_argument(
        "--stage", choices=("layer2", "layer3"), default=None,
        help="also score pairs by this trunk stage's pooled features (read from --model), "
        "without the elementwise embedding features; a gallery runs such a file once "
        "rerank features has stored its items' stage features (item and image queries; a "
        "vector query has none and is refused)",
    )  # fmt: skip
    train.add_argument("--batch-size", type=int, default=64, help="images per embedding batch")
    train.add_argument("--workers", type=int, default=0, help="image-decoding threads")
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    train.set_defaults(func=run_train)
    features = verbs.add_parser(
        "features",
        help="store a gallery's trunk-stage features (for a re-ranker trained with --stage)",
        description="Embed the gallery's items once more with its own model, keeping the "
        "pooled features of a trunk stage, and store them in the gallery folder (float16, by "
        "item id) with the model that gives a query image's (stage_model.onnx), for a "
        "re-ranker trained with rerank train --stage. Items added later have none until this "
        "runs again; compact drops them.",
    )
    features.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    features.add_argument("--stage", choices=("layer2", "layer3"), required=True)
    features.add_argument("--model", type=Path, help="the gallery's model, if moved")
    features.add_argument("--batch-size", type=int, default=64, help="images per batch")
    features.add_argument("--workers", type=int, default=0, help="image-decoding threads")
    features.set_defaults(func=run_features)


def run_train(args: argparse.Namespace) -> int:
    from nearsight.core.errors import NearsightError

    if args.out.suffix != ".onnx":
        raise NearsightError(f"--out must be a .onnx file, got {args.out}")
    if not args.out.parent.is_dir():
        raise NearsightError(f"--out: folder {args.out.parent} does not exist")
    if not 2 <= args.depth <= MAX_DEPTH:
        raise NearsightError(f"--depth must be from 2 to {MAX_DEPTH}, got {args.depth}")
    if args.epochs < 1:
        raise NearsightError(f"--epochs must be at least 1, got {args.epochs}")
    if not 0 < args.held_out < 1:
        raise NearsightError(f"--held-out must be between 0 and 1, got {args.held_out}")
    if not 1 <= args.seeds <= 20:
        raise NearsightError(f"--seeds must be from 1 to 20, got {args.seeds}")
    if args.model.suffix != ".onnx" or not args.model.is_file():
        raise NearsightError(f"--model must be an exported .onnx model file, got {args.model}")
    if args.out.resolve() == args.model.resolve():
        raise NearsightError("--out would overwrite --model: write the re-ranker elsewhere")

    import numpy as np

    from nearsight.data.datasets import load_dataset
    from nearsight.data.embed import check_batching, embed_files
    from nearsight.models.loading import load_embedder
    from nearsight.training.pairwise import FitSettings, export_scorer, fit_scorer

    check_batching(args.batch_size, args.workers)
    split = load_dataset(args.dataset, args.root, "train")  # never the test classes
    embedder = load_embedder(args.model, device="cpu")
    paths = [sample.path for sample in split.samples]
    side = None
    if args.stage is None:
        embedded = embed_files(embedder, paths, batch_size=args.batch_size, workers=args.workers,
                               desc="embedding the training split")  # fmt: skip
    else:
        from nearsight.search.rerank.stage_features import embed_with_stage

        embedded, side = embed_with_stage(args.model, args.stage, paths,
                                          batch_size=args.batch_size, workers=args.workers,
                                          desc="embedding the training split")  # fmt: skip
    for line in embedded.errors:
        print(f"nearsight: skipped {line}", file=sys.stderr)
    labels = np.asarray(split.labels)[embedded.ok]
    # None: the held-out classes choose; the stage features replace the elementwise ones
    elementwise = False if args.list_features_only or args.stage else None
    settings = FitSettings(depth=args.depth, held_out=args.held_out, epochs=args.epochs,
                           seed=args.seed, seeds=args.seeds, elementwise=elementwise)  # fmt: skip
    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    scorer, report = fit_scorer(embedded.embeddings, labels, settings, log=log, side=side)
    extra = {
        "depth": str(report.depth),
        "dataset": args.dataset,
        "fit_classes": ",".join(map(str, report.fit_classes)),
        "held_out_classes": ",".join(map(str, report.held_out_classes)),
        "held_out": json.dumps(
            {
                "plain": asdict(report.plain),
                "chosen": asdict(report.chosen),
                "candidates": [asdict(c) for c in report.candidates],
            }
        ),  # fmt: skip
        "kept": "trained" if report.helped else "base order",
        "verdict": report.verdict,
        **({"side_stage": args.stage} if args.stage else {}),
    }
    parity = export_scorer(scorer, args.out, embedder.model_sha256, extra)
    summary = {
        "out": str(args.out),
        "model_sha256": embedder.model_sha256,
        "parity": parity,
        "helped_on_held_out": report.helped,
        "verdict": report.verdict,
        **{k: v for k, v in asdict(report).items() if k != "rows"},
        "epochs": [asdict(row) for row in report.rows],
    }
    if args.json:
        print(json.dumps(summary, default=float))
        return 0
    print(
        f"wrote {args.out} (parity {parity:.1e}); held-out classes, leave-one-out Recall@1: "
        f"plain {report.plain.recall_at_1:.4f} -> {report.chosen.recall_at_1:.4f}, "
        f"{report.verdict}. Use it: --rerank pairwise:model={args.out},depth={report.depth}"
    )
    return 0


def run_features(args: argparse.Namespace) -> int:
    import numpy as np

    from nearsight.core.digest import file_sha256
    from nearsight.core.errors import NearsightError
    from nearsight.data.embed import check_batching
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.lock import gallery_lock
    from nearsight.search.rerank.stage_features import embed_with_stage, stage_output_model
    from nearsight.search.rerank.stage_store import write_stage_store

    check_batching(args.batch_size, args.workers)
    with Gallery.open(args.gallery) as gallery:
        model = gallery.model_path(args.model)
        if file_sha256(model) != gallery.model_sha256:
            raise NearsightError(f"{model} is not the model gallery {args.gallery} was built with")
        rows = gallery.all_items()
        ids = np.asarray([row["id"] for row in rows], dtype=np.int64)
        stored = gallery.vectors_of(ids)
        folder, sha = gallery.path, gallery.model_sha256
    paths = [row["path"] for row in rows]
    result, side = embed_with_stage(model, args.stage, paths, batch_size=args.batch_size,
                                    workers=args.workers, desc="stage features")  # fmt: skip
    if not result.ok.all():
        raise NearsightError(f"an item's image cannot be read now: {result.errors[0]}")
    # the same model and preprocessing as the gallery's vectors, or the features are not theirs
    agreement = float(np.min(np.sum(result.embeddings * stored, axis=1))) if len(ids) else 1.0
    if agreement < 0.999:
        raise NearsightError(
            f"re-embedding the gallery's images gives other vectors than it stores (cosine "
            f"{agreement:.4f}): were the images changed? rebuild the gallery first"
        )
    with gallery_lock(folder, exclusive=True):
        # with the model that gives a query image's features (serving has no onnx package)
        write_stage_store(folder, args.stage, sha, ids, side, stage_output_model(model, args.stage))
    print(f"stored {args.stage} features of {len(ids)} items ({side.shape[1]}-d, float16) in "
          f"{folder}")  # fmt: skip
    return 0
