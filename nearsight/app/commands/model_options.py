"""The options of ``index build`` and ``index import`` that describe a model exported elsewhere
(an ONNX graph without nearsight's metadata: nearsight.models.foreign), on the command line or in a small
JSON/YAML file (``--model-spec``); those of a timm model's zero-shot gallery (``--model
timm:NAME``: nearsight.models.timm_export); and loading the model they name."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

# the spec file's keys, named as the flags that set them (a flag wins over the file)
FILE_KEYS = ("input_size", "mean", "std", "resize", "output")


def add_foreign_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "a model exported elsewhere",
        "An ONNX model without nearsight's metadata (a CLIP or DINOv2 image tower, a "
        "torchvision network: one [N, 3, H, W] RGB input, one embedding per image). Its "
        "description is stored in the gallery: search, serve and eval need no flags after.",
    )
    group.add_argument(
        "--input-size",
        type=int,
        metavar="PX",
        help="the square crop the model takes, e.g. 224 (default: its input's, when the graph "
        "fixes one)",
    )
    group.add_argument(
        "--mean",
        type=float,
        nargs=3,
        metavar=("R", "G", "B"),
        help="per-channel mean of its input normalisation, pixels in [0, 1] (default ImageNet's)",
    )
    group.add_argument(
        "--std",
        type=float,
        nargs=3,
        metavar=("R", "G", "B"),
        help="per-channel std (default ImageNet's)",
    )
    group.add_argument(
        "--resize",
        type=int,
        metavar="PX",
        help="short side before the centre crop (default 256/224 of --input-size)",
    )
    group.add_argument("--output", metavar="NAME", help="the embedding output (default: the first)")
    group.add_argument(
        "--model-spec",
        type=Path,
        metavar="FILE",
        help="the same description as a JSON or YAML file with keys input_size, mean, std, "
        "resize, output (flags override it)",
    )


def add_timm_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "a timm model (--model timm:NAME)",
        "A zero-shot gallery: the pretrained features of any model of timm's catalogue "
        "(timm:vit_small_patch14_dinov2.lvd142m, timm:vit_base_patch16_clip_224.openai, "
        "timm:convnext_tiny.fb_in22k), exported once to ONNX into nearsight-models/ beside "
        "OUT and reused by later builds. --input-size sets its crop (default: its pretrained "
        "config's). Needs the [train] extra.",
    )
    group.add_argument(
        "--pretrained",
        default="auto",
        metavar="auto|hub|none|FILE",
        help="auto or hub (default): timm's weights from the Hugging Face cache, downloaded "
        "when not cached and there is a network; none: random weights; FILE: a weights file",
    )
    group.add_argument(
        "--pooling",
        choices=["avg", "max", "avgmax", "gem", "token"],
        help="default: the model's own (a ViT's class token, a CNN's average)",
    )


def read_spec_file(path: Path) -> dict[str, Any]:
    """The ``--model-spec`` file's values; an unknown key is an error with a suggestion."""
    import yaml

    from nearsight.core.errors import NearsightError

    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML too
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot read --model-spec {path}: {reason}") from None
    except yaml.YAMLError as error:
        problem = " ".join(str(getattr(error, "problem", "") or error).split())
        raise NearsightError(f"--model-spec {path} is not JSON or YAML ({problem})") from None
    if not isinstance(values, dict):
        raise NearsightError(f"--model-spec {path} must map keys to values")
    for key in values:
        if key not in FILE_KEYS:
            close = difflib.get_close_matches(str(key), FILE_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise NearsightError(
                f"--model-spec {path}: unknown key {key!r}{hint}; keys: {', '.join(FILE_KEYS)}"
            )
    return values


def flag_name(name: str) -> str:
    """An option as the command line spells it: ``input_size`` -> ``--input-size``."""
    return "--" + name.replace("_", "-")


def load_index_model(args: argparse.Namespace) -> Any:
    """The embedder of ``--model`` (nearsight.models.loading.resolve_embedder): a nearsight
    model, one exported elsewhere run as the options above describe (or ``--model-spec``'s
    file), or a timm model's zero-shot export (its ``.path``: the ONNX file the gallery
    records)."""
    import sys

    from nearsight.models.loading import ModelRequest, resolve_embedder

    values: dict[str, Any] = read_spec_file(args.model_spec) if args.model_spec else {}
    values.update({key: getattr(args, key) for key in FILE_KEYS if getattr(args, key) is not None})
    request = ModelRequest(
        args.model,
        pretrained=getattr(args, "pretrained", "auto"),
        pooling=getattr(args, "pooling", None),
        model_spec=args.model_spec,
        **values,
    )
    return resolve_embedder(
        request,
        gallery=args.out,
        device=args.device,
        log=lambda line: print(line, file=sys.stderr),
        name=flag_name,
    )
