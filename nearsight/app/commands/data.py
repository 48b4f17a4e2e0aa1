"""``nearsight data``: make and check datasets."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data", help="make datasets (the synthetic one) and prepare benchmarks"
    )
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

    prepare = data_sub.add_parser(
        "prepare",
        help="extract and check a benchmark's official archive (cub, cars, sop)",
        description="Verify the official archive's published MD5, extract it safely (no member "
        "outside --out, no link created, disk space checked first), check every listed image is there and, for "
        "the official archive, the known image and class counts; then --out is ready for "
        "--dataset NAME --root OUT. A failed check leaves nothing behind.",
    )
    prepare.add_argument("name", choices=["cub", "cars", "sop"], help="the benchmark")
    prepare.add_argument(
        "--archive",
        type=Path,
        required=True,
        help="CUB_200_2011.tgz, car_ims.tgz or Stanford_Online_Products.zip (with --download: "
        "where to save it)",
    )
    prepare.add_argument("--annotations", type=Path, help="cars only: cars_annos.mat")
    prepare.add_argument("--out", type=Path, required=True, help="new dataset folder")
    prepare.add_argument(
        "--strict", action="store_true", help="refuse an archive whose MD5 is not the published one"
    )
    prepare.add_argument(
        "--expect-shape",
        choices=["auto", "on", "off"],
        default="auto",
        help="check the known image and class counts: auto (default) when the MD5 is the "
        "official one, on for any archive, off never",
    )
    prepare.add_argument(
        "--download",
        action="store_true",
        help="first fetch the official archive to --archive (resumable, MD5-verified)",
    )
    prepare.set_defaults(func=run_prepare)


def run_synth(args: argparse.Namespace) -> int:
    from nearsight.data.datasets.synthetic import write_synthetic

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


def run_prepare(args: argparse.Namespace) -> int:
    from nearsight.data.datasets.prepare import fetch, prepare

    start = time.perf_counter()
    if args.download:
        fetch(args.name, args.archive)
    report = prepare(
        args.name,
        args.archive,
        args.out,
        annotations=args.annotations,
        strict=args.strict,
        expect_shape=args.expect_shape,
    )
    print(report.summary(time.perf_counter() - start))
    return 0
