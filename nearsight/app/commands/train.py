"""``nearsight train``: fine-tune the embedding network under a ranking loss."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nearsight.app.commands.device_option import add_device_option


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train an embedding network under a ranking loss",
        description="Fine-tune a ResNet-50 embedding under a ranking loss. Settings come from "
        "the defaults, then --config FILE.yaml (see nearsight/training/configs/), then the options below, "
        "then --set KEY=VALUE. The resolved settings are saved as RUN_DIR/config.yaml. "
        "Under torchrun the run is distributed data parallel.",
    )
    parser.add_argument("--dataset", choices=["cub", "cars", "sop", "folder", "csv"])
    parser.add_argument("--root", help="dataset folder (or its parent)")
    parser.add_argument("--loss", help="loss name (see nearsight/training/losses)")
    parser.add_argument("--out", type=Path, required=True, help="run folder to write")
    parser.add_argument("--config", type=Path, help="YAML file with settings")
    parser.add_argument("--dim", type=int, help="embedding size (default 128)")
    parser.add_argument("--image-size", type=int, help="training and test crop (default 224)")
    parser.add_argument(
        "--pretrained",
        help="auto | imagenet | imagenet-v1 | imagenet-v2 | hub | none | FILE (default auto: "
        "the trunk's weights when cached - torchvision's ImageNet weights for a ResNet, timm's "
        "from the Hugging Face cache for model.arch timm:NAME (hub) - else from scratch, with "
        "a note)",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="updates of the embedding network (default 1000)")
    length.add_argument("--epochs", type=int, help="epochs of the batch sampler")
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="training seconds (evaluations excluded); alone, the run lasts exactly this long "
        "and the learning-rate schedule follows the time",
    )
    parser.add_argument("--classes-per-batch", type=int, help="classes in a batch (n)")
    parser.add_argument("--per-class", type=int, help="images of each class in a batch (m)")
    add_device_option(parser, default=None)
    parser.add_argument("--workers", type=int, help="DataLoader workers")
    parser.add_argument("--eval-every", type=int, help="steps between evaluations")
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting by its dotted name, e.g. --set optim.lr=1e-4 --set loss.params.scale=32",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last.pt"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run_train)


def overrides_from_args(args: argparse.Namespace, file_loss: str | None) -> dict[str, Any]:
    from nearsight.training.config import parse_set_option

    overrides: dict[str, Any] = {}
    simple = {
        "dataset": "data.dataset",
        "root": "data.root",
        "dim": "model.dim",
        "image_size": "data.image_size",
        "pretrained": "model.pretrained",
        "classes_per_batch": "sampler.classes_per_batch",
        "per_class": "sampler.per_class",
        "device": "device",
        "workers": "data.workers",
        "eval_every": "eval_every",
        "seed": "seed",
        "time_limit": "time_limit_s",
    }
    for attr, key in simple.items():
        value = getattr(args, attr)
        if value is not None:
            overrides[key] = str(value) if attr == "root" else value
    if args.loss is not None:
        overrides["loss.name"] = args.loss
        if file_loss is not None and args.loss != file_loss:
            overrides["loss.params"] = {}  # the file's parameters belong to another loss
    if args.steps is not None:
        overrides["steps"], overrides["epochs"] = args.steps, None
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    if args.time_limit is not None and args.steps is None and args.epochs is None:
        overrides["steps"] = None  # --time-limit alone: the time is the run's length
    for text in args.set:
        key, value = parse_set_option(text)
        overrides[key] = value
    return overrides


def run_train(args: argparse.Namespace) -> int:
    import yaml

    from nearsight.core.errors import NearsightError
    from nearsight.training.config import load_config, parse_yaml
    from nearsight.training.run import resume_config, train

    if args.resume:
        config = resume_config(args.out)
    else:
        file_loss = None
        if args.config is not None and args.config.exists():
            try:
                file_loss = ((parse_yaml(args.config.read_text()) or {}).get("loss") or {}).get(
                    "name"
                )
            except (yaml.YAMLError, AttributeError, OSError, UnicodeDecodeError):
                file_loss = None  # load_config reports the problem
        config = load_config(args.config, overrides_from_args(args, file_loss))
        if not config.data.root:
            raise NearsightError("--root is required (the dataset folder or its parent)")
    result = train(config, args.out, resume=args.resume)
    print(json.dumps(result.to_dict()) if args.json else result.summary())
    return 0
