"""Embedding throughput: onnxruntime (CPU) vs torch eager (CPU), and int8 vs fp32.

    .venv/bin/python bench/embed.py [--image-size 224] [--batch 16] [--checkpoint RUN/best.pt]

1. Exports the model (``models.export.export_onnx``, parity-checked) and times torch eager
   and onnxruntime on the same random batch, alternating the two in every round (other work
   on the machine then slows both alike); images/s from the median batch time. Goal: onnxruntime
   >= 1.3x torch.
2. Writes a small synthetic dataset (``data.datasets.synthetic.write_synthetic``), exports a
   static-int8 model calibrated on its train split, times int8 vs fp32 onnxruntime the same
   way, and embeds the test split with both to compare Recall@1 (``data.metrics.recall_at_k``).

Without --checkpoint the model is a randomly initialised ResNet-50 (no ImageNet weights here):
its timings are real, its Recall@1 is that of an untrained network (the int8-vs-fp32 change is
still meaningful). Everything is written to a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from nearsight.data.datasets import load_dataset
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.data.embed import embed_paths
from nearsight.data.images import load_image
from nearsight.data.metrics.retrieval import recall_at_k
from nearsight.models.checkpoint import load_embedding_net, save_checkpoint
from nearsight.models.embedder import OnnxEmbedder, physical_cores
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.export import (
    default_int8_path,
    export_onnx,
    pick_calibration_paths,
    quantize_int8,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", type=Path, help="a trained checkpoint (default: random init)"
    )
    parser.add_argument("--image-size", type=int, default=224, help="crop size (default 224)")
    parser.add_argument("--dim", type=int, default=128, help="embedding size of the random model")
    parser.add_argument("--arch", default="resnet50", help="trunk of the random model")
    parser.add_argument("--batch", type=int, default=16, help="images per batch (default 16)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed batches per runtime (default 3)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed batches first (default 1)")
    parser.add_argument(
        "--threads", type=int, default=physical_cores(), help="CPU threads for both runtimes"
    )
    parser.add_argument("--classes", type=int, default=40, help="synthetic classes (half are test)")
    parser.add_argument("--per-class", type=int, default=8, help="synthetic images per class")
    parser.add_argument(
        "--calibration-images", type=int, default=32, help="int8 calibration images (train split)"
    )
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 part")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return parser.parse_args(argv)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def time_alternating(
    runners: dict[str, Callable[[], object]], rounds: int, warmup: int
) -> dict[str, float]:
    """Median seconds per batch of each runner, the runners taking turns in every round."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict = {"threads": args.threads, "batch": args.batch, "image_size": args.image_size}
    with tempfile.TemporaryDirectory(prefix="nearsight-bench-embed-") as work_dir:
        work = Path(work_dir)
        if args.checkpoint is not None:
            checkpoint = args.checkpoint
            net = load_embedding_net(checkpoint)
            results["model"] = str(checkpoint)
        else:
            torch.manual_seed(0)
            config = EmbeddingConfig(dim=args.dim, image_size=args.image_size, arch=args.arch)
            net = EmbeddingNet(config).eval()
            checkpoint = save_checkpoint(work / "random.pt", net)
            results["model"] = f"random-init {args.arch} dim {args.dim} (no --checkpoint)"
        size = net.config.image_size
        results["image_size"] = size
        say(
            f"model: {results['model']}, image {size}px, batch {args.batch}, {args.threads} threads"
        )

        start = time.perf_counter()
        report = export_onnx(checkpoint, work / "model.onnx")
        results["export"] = {
            "seconds": round(time.perf_counter() - start, 1),
            "max_abs_diff": report.max_abs_diff,
            "opset": report.opset,
            "mb": round(report.size_bytes / 1e6, 1),
        }
        say(f"export: {results['export']}")

        fp32 = OnnxEmbedder(report.path, providers=["CPUExecutionProvider"], threads=args.threads)
        images = torch.rand(args.batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        images_np = images.numpy()

        def torch_eager():
            with torch.inference_mode():
                return net(images)

        medians = time_alternating(
            {"torch": torch_eager, "onnxruntime": lambda: fp32.embed(images_np)},
            args.rounds,
            args.warmup,
        )
        rates = {name: args.batch / seconds for name, seconds in medians.items()}
        results["throughput"] = {
            "torch_eager_images_per_s": round(rates["torch"], 2),
            "onnxruntime_images_per_s": round(rates["onnxruntime"], 2),
            "onnxruntime_over_torch": round(rates["onnxruntime"] / rates["torch"], 3),
        }
        say(f"throughput: {results['throughput']} (goal onnxruntime/torch >= 1.3)")

        if not args.no_int8:
            results["int8"] = bench_int8(args, report.path, fp32, images_np, work)

    if args.json:
        print(json.dumps(results))
    else:
        print_summary(results)
    return 0


def bench_int8(args, fp32_path: Path, fp32: OnnxEmbedder, images, work: Path) -> dict:
    start = time.perf_counter()
    synth = work / "synthetic"
    write_synthetic(synth, classes=args.classes, per_class=args.per_class, size=96, seed=0)
    train = load_dataset("folder", synth, "train")
    test = load_dataset("folder", synth, "test")
    say(
        f"synthetic: {len(train)} train / {len(test)} test images "
        f"in {time.perf_counter() - start:.1f}s"
    )

    start = time.perf_counter()
    report = quantize_int8(
        fp32_path,
        default_int8_path(fp32_path),
        pick_calibration_paths(train.paths, args.calibration_images),
        image_loader=load_image,
    )
    int8 = OnnxEmbedder(report.path, providers=["CPUExecutionProvider"], threads=args.threads)
    out = {
        "quantise_seconds": round(time.perf_counter() - start, 1),
        "calibration_images": report.calibration_images,
        "cosine_to_fp32_mean": round(report.cosine_mean, 4),
        "cosine_to_fp32_min": round(report.cosine_min, 4),
        "mb": round(report.size_bytes / 1e6, 1),
    }
    say(f"int8 export: {out}")

    medians = time_alternating(
        {"fp32": lambda: fp32.embed(images), "int8": lambda: int8.embed(images)},
        args.rounds,
        args.warmup,
    )
    out["fp32_images_per_s"] = round(args.batch / medians["fp32"], 2)
    out["int8_images_per_s"] = round(args.batch / medians["int8"], 2)
    out["int8_over_fp32"] = round(medians["fp32"] / medians["int8"], 3)

    recalls = {}
    for name, embedder in (("fp32", fp32), ("int8", int8)):
        result = embed_paths(
            embedder.embed,
            test.paths,
            image_size=embedder.image_size,
            resize=embedder.resize,
            batch_size=args.batch,
            desc=f"embedding test split ({name})",
        )
        labels = np.asarray(test.labels)[result.ok]
        recalls[name] = recall_at_k(result.embeddings, labels, ks=(1,))[1]
    out["test_images"] = len(test)
    out["test_classes"] = test.num_classes
    out["fp32_recall@1"] = round(recalls["fp32"], 4)
    out["int8_recall@1"] = round(recalls["int8"], 4)
    out["recall@1_change"] = round(recalls["int8"] - recalls["fp32"], 4)
    say(f"int8: {out}")
    return out


def print_summary(results: dict) -> None:
    export, throughput = results["export"], results["throughput"]
    print(
        f"model: {results['model']}; {results['image_size']} px, batch {results['batch']}, "
        f"{results['threads']} CPU threads"
    )
    print(
        f"export: opset {export['opset']}, {export['mb']} MB, parity max |torch - onnxruntime| "
        f"{export['max_abs_diff']:.2e}, {export['seconds']}s"
    )
    print(
        f"torch eager CPU: {throughput['torch_eager_images_per_s']} images/s; onnxruntime CPU: "
        f"{throughput['onnxruntime_images_per_s']} images/s; ratio "
        f"{throughput['onnxruntime_over_torch']}x (goal >= 1.3x)"
    )
    if "int8" in results:
        q = results["int8"]
        print(
            f"int8 ({q['calibration_images']} calibration images, {q['mb']} MB): "
            f"{q['int8_images_per_s']} images/s vs fp32 {q['fp32_images_per_s']} "
            f"({q['int8_over_fp32']}x); cosine to fp32 mean {q['cosine_to_fp32_mean']} "
            f"min {q['cosine_to_fp32_min']}"
        )
        print(
            f"Recall@1 on the synthetic test split ({q['test_images']} images, "
            f"{q['test_classes']} classes): fp32 {q['fp32_recall@1']}, int8 "
            f"{q['int8_recall@1']} (change {q['recall@1_change']:+.4f})"
        )


if __name__ == "__main__":
    sys.exit(main())
