"""``nearsight data``: make and check datasets."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="make datasets (the synthetic one)")
    data_sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    synth = data_sub.add_parser(
        "synth",
        help="write the deterministic synthetic dataset (a folder dataset, train/ and test/)",
        description="Write a deterministic synthetic dataset of fine-grained, class-disjoint "
        "train and test classes as a folder dataset: OUT/train/<class>/*.png, OUT/test/<class>/*.png.",
    )
    synth.add_argument("--out", type=Path, required=True, help="dataset folder to create")
    synth.add_argument("--classes", type=int, default=100, help="number of classes (default 100)")
    synth.add_argument("--per-class", type=int, default=24, help="images per class (default 24)")
    synth.add_argument("--size", type=int, default=96, help="image side in pixels (default 96)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.set_defaults(func=run_synth)


def run_synth(args: argparse.Namespace) -> int:
    from nearsight.index.datasets.synthetic import write_synthetic

    start = time.perf_counter()
    summary = write_synthetic(
        args.out, classes=args.classes, per_class=args.per_class, size=args.size, seed=args.seed
    )
    print(
        f"wrote {summary.images} images of {summary.classes} classes "
        f"({summary.train_classes} train, {summary.test_classes} test) to {args.out} "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return 0
