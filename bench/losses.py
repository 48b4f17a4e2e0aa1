"""Forward+backward time per batch of every registered loss, beside pytorch-metric-learning.

    python bench/losses.py [--device cpu|cuda] [--repeats R] [--warmup W] [--threads T]
                           [--smoke]

Measures, for each batch shape (N = 120 and 180 images, 3 per class as in RLL's and ICE's SOP
setting; D = 128 and 512), the median over R repeats (after W warm-up runs; a cell stops
repeating after ``--cell-seconds`` once it has 3 runs, so slow losses do not stall it) of one
``loss(embeddings, labels)`` plus ``backward()``, for every loss in the registry (rankmi and
bcontrastive when their modules exist; rankmi's time is its embedding step only, the critic
steps are separate calls; the proxy losses over 100 classes, their proxies' gradient included) and for pytorch-metric-learning's RankedListLoss, ContrastiveLoss
and MarginLoss measured in the same run. Without ``--device`` it runs on the CPU and, when
torch.cuda.is_available(), on CUDA too. It ends with the ratio ours-RLL / PML-RLL at N = 180,
D = 512, timed in alternation (one run of each in turn) so that load from other processes
falls on both alike. ``--smoke``: one small shape (N = 30, D = 16), one run per cell, the
ratio at that shape: checks that every loss still runs (tests/bench/test_bench_smoke.py). A
script, not a test.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from pytorch_metric_learning import losses as pml_losses

from nearsight.training.losses.registry import LOSSES, build_loss, loss_parameters

SHAPES = [(120, 128), (120, 512), (180, 128), (180, 512)]
IMAGES_PER_CLASS = 3
RATIO_SHAPE = (180, 512)
SMOKE_SHAPE = (30, 16)


def registered_losses(batch_size: int, dim: int) -> dict[str, torch.nn.Module]:
    """Every registered loss that can be built, with defaults (plus the batch design that
    bcontrastive needs, matching the benchmark's batches, and the proxy losses' classes:
    100 training classes, as CUB's, of which a batch holds some)."""
    built: dict[str, torch.nn.Module] = {}
    for name in LOSSES:
        module_name = LOSSES[name].split(":")[0]
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                print(f"# {name}: {module_name} not present, skipped", file=sys.stderr)
                continue
            raise
        params: dict = {}
        if name == "bcontrastive":
            classes = batch_size // IMAGES_PER_CLASS
            # a synthetic training set: 2 x as many classes as a batch holds, 30-59 images each
            params = {
                "class_counts": {c: 30 + (c * 7) % 30 for c in range(2 * classes)},
                "design": "group",
                "m": IMAGES_PER_CLASS,
                "n": classes,
            }
        elif "class_labels" in loss_parameters(name):
            params = {"class_labels": list(range(100)), "embedding_size": dim}
        built[name] = build_loss(name, **params)
    return built


def pml_references() -> dict[str, Callable]:
    with warnings.catch_warnings():  # PML warns that Tn > 5 may overflow; T = 10 is RLL's value
        warnings.simplefilter("ignore", UserWarning)
        rll = pml_losses.RankedListLoss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2, Tp=0.0)
    return {
        # RLL's paper values; imbalance 0.5 weighs L_P and L_N equally (ours: lam = 1)
        "PML RankedListLoss": rll,
        "PML ContrastiveLoss": pml_losses.ContrastiveLoss(),
        "PML MarginLoss": pml_losses.MarginLoss(),
    }


def time_loss(
    loss: Callable,
    emb: torch.Tensor,
    labels: torch.Tensor,
    repeats: int,
    warmup: int,
    cell_seconds: float,
) -> float:
    """Median seconds of one forward+backward (at least min(3, repeats) timed runs; no new
    run starts once ``cell_seconds`` have been spent timing)."""
    device = emb.device

    def step() -> None:
        leaf = emb.detach().clone().requires_grad_(True)
        loss(leaf, labels).backward()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        step()
    times: list[float] = []
    for _ in range(repeats):
        if len(times) >= 3 and sum(times) > cell_seconds:
            break
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_device(
    device: torch.device,
    repeats: int,
    warmup: int,
    cell_seconds: float,
    shapes: list[tuple[int, int]] = SHAPES,
) -> dict[str, dict]:
    results: dict[str, dict] = {}
    for batch_size, dim in shapes:
        generator = torch.Generator().manual_seed(batch_size * 1000 + dim)
        emb = torch.randn(batch_size, dim, generator=generator)
        emb = torch.nn.functional.normalize(emb, dim=1).to(device)
        labels = torch.arange(batch_size // IMAGES_PER_CLASS).repeat_interleave(IMAGES_PER_CLASS)
        labels = labels.to(device)
        candidates = {**registered_losses(batch_size, dim), **pml_references()}
        for name, loss in candidates.items():
            if isinstance(loss, torch.nn.Module):
                loss.to(device)
            torch.manual_seed(0)
            seconds = time_loss(loss, emb, labels, repeats, warmup, cell_seconds)
            results.setdefault(name, {})[batch_size, dim] = seconds
    return results


def print_table(
    device: torch.device, results: dict[str, dict], shapes: list[tuple[int, int]] = SHAPES
) -> None:
    header = f"{'loss (' + device.type + ', ms fwd+bwd)':<26}" + "".join(
        f"{f'N={n} D={d}':>15}" for n, d in shapes
    )
    print(header)
    print("-" * len(header))
    for name, by_shape in results.items():
        print(f"{name:<26}" + "".join(f"{1000 * by_shape[shape]:>15.3f}" for shape in shapes))
    print()


def head_to_head(
    device: torch.device, repeats: int, warmup: int, shape: tuple[int, int] = RATIO_SHAPE
) -> tuple[float, float]:
    """Median seconds of ours-RLL and PML-RLL at ``shape``, timed in alternation so that
    load from other processes hits both alike."""
    batch_size, dim = shape
    generator = torch.Generator().manual_seed(12345)
    emb = torch.randn(batch_size, dim, generator=generator)
    emb = torch.nn.functional.normalize(emb, dim=1).to(device)
    labels = torch.arange(batch_size // IMAGES_PER_CLASS).repeat_interleave(IMAGES_PER_CLASS)
    labels = labels.to(device)
    ours = build_loss("rll", alpha=1.2, margin=0.4, temperature=10, lam=1.0).to(device)
    pml = pml_references()["PML RankedListLoss"]
    ours_times: list[float] = []
    pml_times: list[float] = []
    for _ in range(repeats):
        ours_times.append(time_loss(ours, emb, labels, 1, warmup, float("inf")))
        pml_times.append(time_loss(pml, emb, labels, 1, warmup, float("inf")))
    return statistics.median(ours_times), statistics.median(pml_times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cpu, and cuda if any")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per cell (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per cell first")
    parser.add_argument(
        "--cell-seconds", type=float, default=1.0, help="stop repeating a cell after this long"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--smoke", action="store_true", help="one small shape, one run a cell")
    args = parser.parse_args(argv)
    shapes, ratio_shape = ([SMOKE_SHAPE], SMOKE_SHAPE) if args.smoke else (SHAPES, RATIO_SHAPE)
    if args.smoke:
        args.repeats, args.warmup, args.cell_seconds = 1, 0, 0.0
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.device:
        devices = [args.device]
    else:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"{args.repeats} repeats after {args.warmup} warm-up runs, {IMAGES_PER_CLASS} images "
        "per class\n"
    )
    for device_name in devices:
        device = torch.device(device_name)
        results = bench_device(device, args.repeats, args.warmup, args.cell_seconds, shapes)
        print_table(device, results, shapes)
        ours, pml = head_to_head(device, 5 * args.repeats, 1, ratio_shape)
        n, d = ratio_shape
        print(
            f"ratio ours-RLL / PML-RLL at N={n}, D={d} on {device.type} (alternating runs, "
            f"median of {5 * args.repeats}): {ours / pml:.2f} "
            f"({1000 * ours:.3f} ms vs {1000 * pml:.3f} ms)\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
