"""timm trunks, one per family (CNN: ResNet-50; ConvNeXt-T; ViT-S/16): export, onnxruntime
images/s (fp32 and int8) and the training step against the bare timm network.

    python bench/timm_backbones.py                          # CPU, 224 px, all three families
    python bench/timm_backbones.py --families vit --batch 32 --json vit.json
    python bench/timm_backbones.py --device cuda --batch 64 --no-onnx   # the train rows on a GPU
    python bench/timm_backbones.py --smoke                  # timm's test_* models at 32 px

Per family, with random weights (nothing is downloaded: timings do not depend on the weights;
the int8 cosine does, so on pretrained weights it can differ):

1. export: ``export_onnx`` of a nearsight checkpoint (the trunk's own pooling, a 128-d head),
   parity-checked against torch on batches of 4 and 1, then ``quantize_int8`` calibrated on
   synthetic 256 px images; seconds of each, the parity and the int8 cosine to fp32.
2. onnxruntime on the CPU at the image size, fp32 and int8, on the same random batch,
   alternating the two in every round (other load slows both alike); images/s from the median.
3. train step: nearsight's network (normalisation, the timm trunk, pooling, head, L2 norm) under
   a seed loss (ICE) with AdamW, against the bare timm model with its 1,000-class classifier
   under cross-entropy with AdamW, on the same batch in memory (fp32 on the CPU, bf16 autocast on
   CUDA), alternating the two; images/s from the median step. The ratio nearsight / bare is the
   cost of what nearsight adds around the trunk (goal: >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedder import OnnxEmbedder, physical_cores
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
from nearsight.models.export import default_int8_path, export_onnx, quantize_int8
from nearsight.models.quantize import CPU_ONLY
from nearsight.training.losses import build_loss

FAMILIES = {
    "cnn": "timm:resnet50",
    "convnext": "timm:convnext_tiny",
    "vit": "timm:vit_small_patch16_224",
}
SMOKE_FAMILIES = {
    "cnn": "timm:test_resnet",
    "convnext": "timm:test_convnext",
    "vit": "timm:test_vit",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="cnn,convnext,vit", help="cnn, convnext, vit")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=16, help="images per batch (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--calibration", type=int, default=32, help="int8 calibration images")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="train rows")
    parser.add_argument("--no-onnx", action="store_true", help="only the train rows")
    parser.add_argument("--smoke", action="store_true", help="timm's test_* models, 32 px")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.image_size, args.batch, args.rounds, args.calibration = 32, 4, 1, 4
    table = SMOKE_FAMILIES if args.smoke else FAMILIES
    args.families = {name: table[name] for name in args.families.split(",") if name}
    return args


def alternate(runs: dict[str, Callable[[], Any]], rounds: int, warmup: int) -> dict[str, float]:
    """Median seconds of each callable, run in turn in every round."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(warmup + rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def export_rows(arch: str, args: argparse.Namespace, work: Path, images: list[Path]) -> dict:
    torch.manual_seed(0)
    config = EmbeddingConfig(arch=arch, dim=128, image_size=args.image_size)
    checkpoint = save_checkpoint(work / "net.pt", build_embedding_net(config))
    model = work / "model.onnx"
    report = export_onnx(checkpoint, model)
    start = time.perf_counter()
    int8 = quantize_int8(model, default_int8_path(model), images[: args.calibration])
    int8_seconds = time.perf_counter() - start
    fp32_session = OnnxEmbedder(model, providers=CPU_ONLY)
    int8_session = OnnxEmbedder(int8.path, providers=CPU_ONLY)
    batch = np.random.default_rng(0).random(
        (args.batch, 3, args.image_size, args.image_size), dtype=np.float32
    )
    seconds = alternate(
        {"fp32": lambda: fp32_session.embed(batch), "int8": lambda: int8_session.embed(batch)},
        args.rounds,
        args.warmup,
    )
    return {
        "export_seconds": round(report.seconds, 1),
        "parity_max_abs_diff": report.max_abs_diff,
        "onnx_mb": round(report.size_bytes / 2**20, 1),
        "int8_seconds": round(int8_seconds, 1),
        "int8_mb": round(int8.size_bytes / 2**20, 1),
        "int8_cosine_mean": round(int8.cosine_mean, 4),
        "int8_cosine_min": round(int8.cosine_min, 4),
        "int8_calibration_images": int8.calibration_images,
        "ort_fp32_images_per_s": round(args.batch / seconds["fp32"], 1),
        "ort_int8_images_per_s": round(args.batch / seconds["int8"], 1),
        "int8_speedup": round(seconds["fp32"] / seconds["int8"], 2),
    }


def train_rows(arch: str, args: argparse.Namespace) -> dict:
    import timm

    device = torch.device(args.device)
    torch.manual_seed(0)
    net = build_embedding_net(EmbeddingConfig(arch=arch, dim=128, image_size=args.image_size))
    kwargs = {"img_size": args.image_size} if net.timm.takes_img_size else {}
    bare = timm.create_model(net.timm.name, pretrained=False, num_classes=1000, **kwargs)
    net.to(device).train()
    bare.to(device).train()
    loss = build_loss("ice", scale=64.0).to(device)
    ours_opt = torch.optim.AdamW(net.parameters(), lr=1e-5)
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=1e-5)
    size = args.image_size
    images = torch.rand(args.batch, 3, size, size, device=device)
    labels = torch.arange(args.batch, device=device) // 4  # 4 images a class
    classes = torch.randint(0, 1000, (args.batch,), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def ours() -> None:
        with autocast:
            embeddings = net(images)
        value = loss(embeddings.float(), labels)
        ours_opt.zero_grad(set_to_none=True)
        value.backward()
        ours_opt.step()
        sync()

    def bare_step() -> None:
        with autocast:
            logits = bare(images)
        value = torch.nn.functional.cross_entropy(logits.float(), classes)
        bare_opt.zero_grad(set_to_none=True)
        value.backward()
        bare_opt.step()
        sync()

    seconds = alternate({"nearsight": ours, "bare": bare_step}, args.rounds, args.warmup)
    return {
        "train_images_per_s": round(args.batch / seconds["nearsight"], 1),
        "bare_train_images_per_s": round(args.batch / seconds["bare"], 1),
        "train_ratio": round(seconds["bare"] / seconds["nearsight"], 2),
        "train_device": args.device + (" bf16" if device.type == "cuda" else " fp32"),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "environment": {
            "machine": platform.processor() or platform.machine(),
            "physical_cores": physical_cores(),
            "load_average_start": os.getloadavg(),
            "torch": torch.__version__,
            "image_size": args.image_size,
            "batch": args.batch,
            "rounds": args.rounds,
        },
        "families": {},
    }
    with tempfile.TemporaryDirectory(prefix="nearsight-timm-bench-") as tmp:
        work = Path(tmp)
        images: list[Path] = []
        if not args.no_onnx:
            write_synthetic(work / "data", classes=8, per_class=4, size=256, seed=0)
            images = sorted((work / "data").rglob("*.png"))
        for family, arch in args.families.items():
            print(f"== {family}: {arch}", file=sys.stderr, flush=True)
            row: dict[str, Any] = {"arch": arch}
            if not args.no_onnx:
                row.update(export_rows(arch, args, work, images))
            row.update(train_rows(arch, args))
            results["families"][family] = row
            print(json.dumps(row), file=sys.stderr, flush=True)
    results["environment"]["load_average_end"] = os.getloadavg()
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def table(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"{env['physical_cores']} physical cores, {env['image_size']} px, batch {env['batch']}, "
        f"load average {env['load_average_start'][0]:.1f} -> {env['load_average_end'][0]:.1f}",
        f"{'family':<9} {'export s':>8} {'parity':>8} {'fp32 img/s':>10} {'int8 img/s':>10} "
        f"{'cosine':>7} {'train img/s':>11} {'bare img/s':>10} {'ratio':>6}",
    ]
    for family, row in results["families"].items():
        lines.append(
            f"{family:<9} {row.get('export_seconds', '-'):>8} "
            f"{row.get('parity_max_abs_diff', float('nan')):>8.1e} "
            f"{row.get('ort_fp32_images_per_s', '-'):>10} {row.get('ort_int8_images_per_s', '-'):>10} "
            f"{row.get('int8_cosine_mean', '-'):>7} {row['train_images_per_s']:>11} "
            f"{row['bare_train_images_per_s']:>10} {row['train_ratio']:>6}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
