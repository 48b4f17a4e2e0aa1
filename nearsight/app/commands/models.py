"""``nearsight models``: what can embed images here (cached pretrained timm models, torch.hub
weights, ONNX files given by path, the models galleries record), or one line on how to get a
model where there is none."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list the models that can embed images here",
        description="List what can embed images on this machine, offline: pretrained timm "
        "models whose weights the Hugging Face cache holds (--model timm:NAME), weights in "
        "torch.hub's cache (--pretrained), the ONNX files given as PATH (files, or folders "
        "searched for *.onnx), and the model each --gallery records. Where there is none, one "
        "line says how to get one.",
    )
    parser.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                        help="ONNX files or folders holding them")  # fmt: skip
    parser.add_argument("--gallery", action="append", type=Path, default=[],
                        help="a gallery folder whose recorded model to list (repeatable)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print a JSON list of the models")
    parser.set_defaults(func=run_models)


def run_models(args: argparse.Namespace) -> int:
    from nearsight.models.available import (
        HOW_TO_GET_ONE,
        cached_timm,
        cached_torch_weights,
        describe_onnx,
        onnx_files,
    )

    found = [*cached_timm(), *cached_torch_weights()]
    found += [describe_onnx(path) for path in onnx_files(args.paths)]
    found += gallery_models(args.gallery)
    if args.json:
        print(json.dumps([asdict(model) for model in found], ensure_ascii=False))
        return 0
    usable = [model for model in found if model.usable]
    for model in found:
        mark = "" if model.usable else "  (not usable)"
        print(f"{model.kind:<9}  {model.name}{mark}\n           {model.detail}\n"
              f"           use: {model.use}")  # fmt: skip
    if not usable:
        print(HOW_TO_GET_ONE)
    return 0


def gallery_models(galleries: list[Path]):
    """The model each gallery records, and whether it is on this machine."""
    from nearsight.index.gallery.core import Gallery
    from nearsight.models.available import Available

    found = []
    for folder in galleries:
        with Gallery.open(folder) as gallery:
            recorded = gallery.meta.get("model")
        if not recorded:
            found.append(Available("gallery", str(folder), "records no model (imported vectors): "
                                   "search it by --id, --key or --vector", "-",
                                   usable=False))  # fmt: skip
            continue
        here = Path(str(recorded)).is_file()
        use = (
            f"nearsight search --gallery {folder} IMAGE"
            if here
            else f"copy it here, or give --model FILE (the same model) to search {folder}"
        )
        found.append(Available("gallery", str(recorded), f"the model of gallery {folder}"
                               + ("" if here else ": not on this machine"), use,
                               usable=here))  # fmt: skip
    return found
