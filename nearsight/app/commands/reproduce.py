"""``nearsight reproduce``: a config's whole chain, and its paper's row beside ours."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reproduce",
        help="train, export, index and evaluate a config; compare with its paper's row",
        description="Reproduce a paper's row: train CONFIG on the dataset at --root, export "
        "best.pt to ONNX, index the test split, evaluate it by the paper's protocol (Recall@k, "
        "NMI as the paper defines it where it reports one, MAP@R) and write "
        "RUN/reproduction.md and .json with the paper's row (cited) beside ours, the device "
        "and the precision (bf16 or fp32) the training ran in. Each stage whose output is complete is skipped: run "
        "the same command again to resume after an interruption. Under torchrun, training is "
        "distributed and the index built in shards. See docs/reproducing.md.",
    )
    parser.add_argument(
        "config", help="a config file, or a shipped config by name (e.g. rankmi_cub)"
    )
    parser.add_argument("--root", type=Path, required=True, help="dataset folder (or its parent)")
    parser.add_argument("--out", type=Path, required=True, help="run folder (new, or to resume)")
    parser.add_argument(
        "--selection",
        choices=["test", "val"],
        default="test",
        help="how best.pt is chosen: test = best test Recall@1 (default); val = on a tenth "
        "of the training classes held out (data.val_classes). The table also shows the "
        "final step's network",
    )
    parser.add_argument(
        "--pretrained",
        metavar="WEIGHTS",
        help="the trunk's starting weights, instead of the config's (imagenet for a ResNet, "
        "hub for a timm trunk): imagenet | imagenet-v1 | imagenet-v2 (torchvision's, for a "
        "ResNet) | hub (a timm trunk's pretrained weights, from the Hugging Face cache) | "
        "none (from scratch) | FILE (.pth, .safetensors); the same as --set "
        "model.pretrained=WEIGHTS, and listed in the table as a difference",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a setting (e.g. --set steps=100); the report lists every change",
    )
    parser.add_argument("--workers", type=int, help="image decoding processes of the index build")
    parser.set_defaults(func=run_reproduce)


def run_reproduce(args: argparse.Namespace) -> int:
    from nearsight.app.reproduce.run import Reproduction
    from nearsight.training.config import parse_set_option

    overrides = dict(parse_set_option(text) for text in args.set)
    if args.pretrained is not None:
        overrides["model.pretrained"] = args.pretrained
    Reproduction(
        config=args.config,
        root=args.root.expanduser().absolute(),
        out=args.out.expanduser().absolute(),
        overrides=overrides,
        selection=args.selection,
        workers=args.workers,
    ).run()
    return 0
