"""``nearsight export``: a checkpoint to the one-file ONNX model, checked against torch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a checkpoint to a one-file ONNX model (parity-checked against torch)",
        description="Export a training checkpoint to ONE .onnx file: input 'images' float32 "
        "[N,3,H,W] RGB in [0,1] (ImageNet normalisation is inside the graph), output "
        "'embeddings' [N,D] with unit L2 norm, dynamic N, and the model's settings as ONNX "
        "metadata. torch and onnxruntime are compared on a random batch; the export fails "
        "(and writes nothing) above 1e-4. With --int8, a statically quantised copy "
        "(QDQ, per-channel) is written beside it as <stem>.int8.onnx.",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="the checkpoint (RUN_DIR/best.pt), or a run folder (its best.pt is used)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset, 13-20 (default 17)")
    parser.add_argument(
        "--parity-batch", type=int, default=4, help="images in the parity check (default 4)"
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="also write a static int8 model (<stem>.int8.onnx) calibrated on real images",
    )
    parser.add_argument(
        "--int8-out", type=Path, help="where to write the int8 model (default <stem>.int8.onnx)"
    )
    parser.add_argument(
        "--calibration-dataset",
        choices=["cub", "cars", "sop", "folder", "csv"],
        help="dataset of the int8 calibration images",
    )
    parser.add_argument("--calibration-root", help="its folder (or parent)")
    parser.add_argument(
        "--calibration-split",
        default="train",
        choices=["train", "test", "all"],
        help="split to draw calibration images from (default train)",
    )
    parser.add_argument(
        "--calibration-images",
        type=int,
        default=64,
        help="calibration images, spread over the split (default 64)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from nearsight.core.errors import NearsightError
    from nearsight.models.export import export, pick_calibration_paths

    checkpoint: Path = args.checkpoint
    if checkpoint.is_dir():
        checkpoint = checkpoint / "best.pt"
    if args.out.suffix.lower() != ".onnx":
        raise NearsightError(f"--out must be a .onnx file, got {args.out}")
    calibration_given = args.calibration_dataset or args.calibration_root or args.int8_out
    if calibration_given and not args.int8:
        raise NearsightError(
            "--calibration-dataset/--calibration-root/--int8-out only apply with --int8"
        )
    calibration = None
    image_loader = None
    if args.int8:
        if not (args.calibration_dataset and args.calibration_root):
            raise NearsightError(
                "--int8 needs calibration images: "
                "--calibration-dataset NAME --calibration-root PATH"
            )
        if args.calibration_images <= 0:
            raise NearsightError(
                f"--calibration-images must be positive, got {args.calibration_images}"
            )
        if not checkpoint.is_file():
            raise NearsightError(f"checkpoint not found: {checkpoint}")
        from nearsight.data.datasets import load_dataset
        from nearsight.data.images import load_image

        split = load_dataset(
            args.calibration_dataset, args.calibration_root, args.calibration_split
        )
        calibration = pick_calibration_paths(split.paths, args.calibration_images)
        image_loader = load_image

    report = export(
        checkpoint,
        args.out,
        opset=args.opset,
        parity_batch=args.parity_batch,
        int8_calibration=calibration,
        int8_out=args.int8_out,
        image_loader=image_loader,
        log=lambda line: print(f"{line} ...", file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    print(
        f"exported {report.path} ({report.size_bytes / 1e6:.1f} MB, opset {report.opset}, "
        f"{report.exporter} exporter, dim {report.dim}, image {report.image_size} "
        f"resize {report.resize}) in {report.seconds:.1f}s"
    )
    print(
        f"parity: max |torch - onnxruntime| = {report.max_abs_diff:.2e} "
        f"(batches of {' and '.join(map(str, report.parity_batches))}; limit 1e-4)"
    )
    print(f"model sha256 {report.model_sha256} (checkpoint sha256 {report.checkpoint_sha256})")
    if report.int8 is not None:
        int8 = report.int8
        print(
            f"int8: {int8.path} ({int8.size_bytes / 1e6:.1f} MB); cosine to fp32 "
            f"on {int8.calibration_images} calibration images: mean "
            f"{int8.cosine_mean:.4f}, min {int8.cosine_min:.4f}"
        )
    return 0
