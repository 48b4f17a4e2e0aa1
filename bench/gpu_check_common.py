"""Shared pieces of bench/gpu_check.py: the run context, part results, sizes, timing and the
synthetic JPEG dataset."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

H200_GOAL_IMAGES_PER_S = 3000.0  # issue #18: training images/s goal on one H200
BARE_RATIO_GOAL = 0.9  # full training step / bare forward+backward (issue 55)
JPEG_QUALITY = 90
SOURCE_SIZE = 256  # the papers resize to 256 before cropping 224/227


class Skip(Exception):
    """A part (or row) that cannot run here, with the reason."""


@dataclass
class Sizes:
    """Every size the check uses; ``full`` for a GPU, ``smoke`` for the CPU self-test."""

    image_size: int
    train_steps: int  # timed steps per loss
    train_warmup: int
    batch_scale: float  # papers' batch sizes times this (smoke: tiny batches)
    train_classes: int  # synthetic classes in the train split
    images_per_class: int  # train images per class (JPEG copies of a few distinct ones)
    data_batches: int
    serve_batches: tuple[int, ...]
    serve_iterations: dict[int, int]
    compile: bool
    search_items: int
    search_dim: int
    search_single_queries: int
    search_batch: int
    eval_items: int
    eval_classes: int
    resume_steps: int

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            image_size=224,
            train_steps=20,
            train_warmup=5,
            batch_scale=1.0,
            train_classes=70,  # >= 60 classes per batch (RLL's design)
            images_per_class=66,  # one epoch >= (20 + 5) x 180 images: no loader restart
            data_batches=40,
            serve_batches=(1, 64),
            serve_iterations={1: 200, 64: 30},
            compile=True,
            search_items=1_000_000,
            search_dim=128,
            search_single_queries=200,
            search_batch=1024,
            eval_items=60_502,  # SOP's test split
            eval_classes=11_316,
            resume_steps=6,
        )

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            image_size=32,
            train_steps=1,
            train_warmup=1,  # RankMI: one embedding step, then one critic step
            batch_scale=0.0,  # every design shrunk to 4 classes x 2 images
            train_classes=5,
            images_per_class=8,
            data_batches=3,
            serve_batches=(1, 4),
            serve_iterations={1: 3, 4: 2},
            compile=False,
            search_items=5_000,
            search_dim=16,
            search_single_queries=5,
            search_batch=64,
            eval_items=2_000,
            eval_classes=400,
            resume_steps=4,
        )


@dataclass
class Part:
    name: str
    status: str = "ok"
    reason: str | None = None
    seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def row(self, name: str, value: float | None = None, unit: str = "", **extra: Any) -> None:
        """One measurement: ``peer`` (same unit) gives ``ratio`` = value / peer."""
        record: dict[str, Any] = {"name": name, "value": value, "unit": unit, **extra}
        peer = extra.get("peer")
        if value is not None and peer:
            record.setdefault("ratio", round(value / peer, 3))
        self.rows.append(record)
        # each row as it is measured: a part stopped from outside (a timeout) leaves its rows
        self.progress(f"{name}: {value} {unit}" + (f" (peer {peer})" if peer else ""))

    def skip_row(self, name: str, reason: str) -> None:
        self.rows.append({"name": name, "skipped": reason})
        self.progress(f"{name}: skipped: {reason}")

    def progress(self, line: str) -> None:
        print(f"   {self.name}: {line}", file=sys.stderr, flush=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "seconds": self.seconds,
            "rows": self.rows,
            **({"info": self.info} if self.info else {}),
        }


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass
class Context:
    workdir: Path
    sizes: Sizes
    smoke: bool
    cuda: bool
    device: str  # where the "GPU" rows run: cuda, or cpu in --cpu-smoke
    device_name: str
    cores: int
    workers: int
    note: str | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    # the train part: which steps (eager, compiled), the compiled step's torch.compile mode,
    # and which losses (None: all six designs)
    train_steps: tuple[str, ...] = ("eager", "compiled")
    compile_mode: str = "default"
    train_losses: tuple[str, ...] | None = None

    @classmethod
    def create(cls, workdir: Path, sizes: Sizes, smoke: bool, workers: int | None) -> Context:
        import torch

        cuda = torch.cuda.is_available() and not smoke
        if smoke:
            # the self-test shares its CPU with others: two spinning intra-op threads on a busy
            # 2-core machine made a ResNet-50 step 4x slower than one thread
            torch.set_num_threads(1)
        note = None
        if smoke:
            name = "CPU (--cpu-smoke)"
        elif cuda:
            name = torch.cuda.get_device_name(0)
        else:
            name = "CPU (no CUDA device)"
            note = "no CUDA device here: the GPU rows are skipped, the CPU peers still run"
        cores = usable_cores()
        if workers is None:  # smoke: no worker processes to start (seconds each on a busy CPU)
            workers = 0 if smoke else cores
        return cls(
            workdir=workdir,
            sizes=sizes,
            smoke=smoke,
            cuda=cuda,
            device="cuda" if cuda else "cpu",
            device_name=name,
            cores=cores,
            workers=workers,
            note=note,
        )

    def require_gpu(self, what: str) -> None:
        """Raise Skip unless the GPU rows can run (on the GPU, or on the CPU in smoke mode)."""
        if not (self.cuda or self.smoke):
            raise Skip(f"{what} needs a CUDA device (torch.cuda.is_available() is False)")

    def synchronize(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def time_calls(
    ctx: Context, call: Callable[[], Any], iterations: int, warmup: int = 2
) -> list[float]:
    """Seconds per call of ``call`` (GPU work synchronised), after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    ctx.synchronize()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        ctx.synchronize()
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def synthetic_jpegs(ctx: Context) -> Path:
    """A folder dataset of JPEGs (quality 90, 256 px) made from ``nearsight data synth``: a few
    distinct images per class, hard-linked to ``images_per_class`` files so that one epoch
    covers the timed steps without a DataLoader restart (decoding cost does not depend on an
    image being unique). The test split keeps 4 images per class: every run's final
    evaluation is not what is measured."""
    if "jpegs" in ctx.cache:
        return ctx.cache["jpegs"]
    from PIL import Image

    from nearsight.data.datasets.synthetic import write_synthetic

    sizes = ctx.sizes
    distinct = 4
    png_root = ctx.workdir / "synth_png"
    root = ctx.workdir / "synth_jpeg"
    if not root.exists():
        size = sizes.image_size if ctx.smoke else SOURCE_SIZE
        write_synthetic(
            png_root, classes=2 * sizes.train_classes, per_class=distinct, size=size, seed=0
        )
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for split in ("train", "test"):
            for class_dir in sorted((png_root / split).iterdir()):
                if not class_dir.is_dir():
                    continue
                target = tmp / split / class_dir.name
                target.mkdir(parents=True)
                sources = []
                for png in sorted(class_dir.glob("*.png")):
                    jpeg = target / (png.stem + ".jpg")
                    Image.open(png).convert("RGB").save(jpeg, quality=JPEG_QUALITY)
                    sources.append(jpeg)
                copies = sizes.images_per_class if split == "train" else len(sources)
                for i in range(len(sources), copies):
                    os.link(sources[i % len(sources)], target / f"copy{i:04d}.jpg")
        tmp.rename(root)
        shutil.rmtree(png_root, ignore_errors=True)
    ctx.cache["jpegs"] = root
    return root
