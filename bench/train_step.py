"""Images/s of a full nearsight training step against the bare ResNet-50 forward+backward.

The full step is the real trainer with its defaults (DataLoader workers decoding PNGs, seeded
augmentation, the loss, the optimiser step; on a CPU with native bf16, bf16 autocast and
channels_last, as `training.amp`/`channels_last: auto` choose) on a synthetic dataset; the
peer is the same embedding network's plain fp32 forward+backward on a random tensor already in
memory (on CUDA: bf16 and channels_last), measured in the same run. On a CPU the ratio full /
bare is what the defaults gain over fp32 after data and loss overhead (issue 27's goal: 1.5).

    python bench/train_step.py                       # CPU, 64 px, batch 32
    python bench/train_step.py --device cuda --image-size 224 --batch 120 --steps 40
    python bench/train_step.py --image-size 48 --workers 1 --cache-images   # the demo's data path
    python bench/train_step.py --device cuda --image-size 224 --batch 120 --compile off
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
from nearsight.training.config import load_config
from nearsight.training.config_checks import COMPILE_SETTINGS
from nearsight.training.run import train


def bare_images_per_s(
    args: argparse.Namespace, device: torch.device, bf16: bool | None = None
) -> float:
    """The bare forward+backward; ``bf16`` (default: on CUDA only) with channels_last."""
    bf16 = device.type == "cuda" if bf16 is None else bf16
    model = build_embedding_net(EmbeddingConfig(dim=args.dim, image_size=args.image_size))
    model.to(device).train()
    images = torch.rand(args.batch, 3, args.image_size, args.image_size, device=device)
    if bf16:
        model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    times = []
    for i in range(args.steps + args.warmup):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            out = model(images)
        out.float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    return args.batch / statistics.median(times)


def full_images_per_s(args: argparse.Namespace, data: Path, out: Path) -> float:
    per_class = 4
    config = load_config(
        None,
        {
            "data.dataset": "folder",
            "data.root": str(data),
            "data.image_size": args.image_size,
            "data.workers": args.workers,
            "data.cache_images": args.cache_images,
            "model.dim": args.dim,
            "model.pretrained": "none",
            "loss.name": args.loss,
            "sampler.classes_per_batch": args.batch // per_class,
            "sampler.per_class": per_class,
            "steps": args.steps + args.warmup,
            "eval_every": 10**9,  # only the final evaluation
            "save_every": 10**9,
            "log_every": 1,  # images_per_s per step, not averaged over a logging interval
            "device": args.device,
            "compile": args.compile,
        },
    )
    train(config, out)
    lines = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    # with log_every=1, images_per_s of step s covers the interval since step s-1
    rates = [r["images_per_s"] for r in lines[args.warmup :]]
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--loss", default="ice")
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--compile",
        default="auto",
        choices=COMPILE_SETTINGS,
        help="the trainer's torch.compile setting (auto: on CUDA only)",
    )
    parser.add_argument(
        "--cache-images",
        action="store_true",
        help="decode the training images once and keep them in memory (data.cache_images)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "synth"
        write_synthetic(data, classes=40, per_class=16, size=max(args.image_size, 64), seed=0)
        # the peer is measured before and after the full steps and the faster kept, so a
        # burst of load from other processes does not flatter the ratio
        bare_before = bare_images_per_s(args, device)
        full = full_images_per_s(args, data, Path(tmp) / "run")
        bare = max(bare_before, bare_images_per_s(args, device))
        # what bf16 + channels_last buy on the bare network: the ceiling for the full step
        bare_bf16 = bare_images_per_s(args, device, bf16=True) if device.type == "cpu" else None
    print(
        f"device {args.device}, ResNet-50, {args.image_size} px, batch {args.batch}, loss "
        f"{args.loss}, workers {args.workers}, cached images {args.cache_images}, "
        f"compile {args.compile}"
    )
    print(f"{'bare forward+backward':<28} {bare:8.1f} images/s")
    if bare_bf16 is not None:
        print(f"{'bare, bf16 + channels_last':<28} {bare_bf16:8.1f} images/s")
    print(f"{'full training step':<28} {full:8.1f} images/s")
    print(f"{'ratio full / bare':<28} {full / bare:8.2f}")


if __name__ == "__main__":
    main()
