"""bench/gpu_check.py parts that train: ``train`` (per-loss throughput), ``data`` (the
DataLoader alone, and JPEG decoding on the GPU) and ``resume`` (exact resume on the GPU)."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_common import (
    BARE_RATIO_GOAL,
    H200_GOAL_IMAGES_PER_S,
    Context,
    Part,
    median,
    synthetic_jpegs,
)

import nearsight.training as training_package
from nearsight.training.config import load_config

# the shipped paper configs (nearsight/training/configs/*_cub.yaml): a path that does not
# exist would make loss_config fall back to the default 16x4 design without a word
CONFIGS = Path(training_package.__file__).resolve().parent / "configs"
SEED_LOSSES = ("ice", "rll", "nra", "rankmi", "bcontrastive")
PROXY_BASELINE = "proxyanchor"
# Proxy Anchor (Kim et al., CVPR 2020) trains with batches of 180; used when no config file
# for it exists
PROXY_DESIGN = (60, 3)


def train_workers(ctx: Context) -> int:
    """DataLoader workers for the trainer: one per core but two, left to the process that
    launches the step's kernels and to its pin-memory thread (a worker on every core starves
    them; the data part shows the loader alone far above the step's rate)."""
    if ctx.smoke or ctx.workers <= 2:
        return ctx.workers
    return max(2, min(ctx.workers, ctx.cores - 2))


def loss_config(ctx: Context, loss: str, root: Path, out_steps: int, **extra: Any):
    """The paper's CUB configuration of ``loss`` (batch design, optimiser, dim) on the
    synthetic JPEGs at the check's image size, from scratch, on the check's device."""
    path = CONFIGS / f"{loss}_cub.yaml"
    overrides: dict[str, Any] = {
        "data.dataset": "folder",
        "data.root": str(root),
        "data.image_size": ctx.sizes.image_size,
        "data.workers": train_workers(ctx),
        "data.eval_batch_size": 256 if ctx.cuda else 16,
        "model.pretrained": "none",
        "loss.name": loss,
        "steps": out_steps,
        "eval_every": 10**9,  # only the final evaluation
        "save_every": 10**9,
        "log_every": 1,  # images_per_s of every step
        "device": ctx.device,
    }
    if not path.exists() and loss == PROXY_BASELINE:
        overrides["sampler.classes_per_batch"], overrides["sampler.per_class"] = PROXY_DESIGN
    if ctx.sizes.batch_scale == 0.0:  # smoke: 4 classes x 2 images
        overrides["sampler.classes_per_batch"], overrides["sampler.per_class"] = 4, 2
    overrides.update(extra)
    return load_config(path if path.exists() else None, overrides)


def bare_images_per_s(ctx: Context, batch: int, dim: int) -> float:
    """bench/train_step.py's peer: the embedding network's forward+backward on a batch already
    on the device (bf16 autocast and channels_last on CUDA)."""
    from train_step import bare_images_per_s as bare

    key = ("bare", batch, dim)
    args = argparse.Namespace(
        dim=dim,
        image_size=ctx.sizes.image_size,
        batch=batch,
        steps=ctx.sizes.train_steps,
        warmup=ctx.sizes.train_warmup,
    )
    value = bare(args, torch.device(ctx.device))
    ctx.cache[key] = max(value, ctx.cache.get(key, 0.0))  # the faster of repeated runs
    if ctx.cuda:
        torch.cuda.empty_cache()
    return ctx.cache[key]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


PROFILED_BATCHES = 3  # after the timed steps, outside their median
# the runs of the train part stop starting after this (each run's time, compiling included,
# is known from the longest so far): the whole check must fit a lent machine's 10 minutes
TRAIN_BUDGET_S = 480
# --cpu-smoke trains two runs, the script's own paths: ICE eager (the export part serves its
# checkpoint) and RankMI compiled (its critic batches after each step, the profile's longer
# count, the compiled step's run folder and row). Every other loss and step gets its config
# built and a row skipped with the reason: the trainer's losses, eager and compiled (a
# whole-graph loss on three heads, a loss beside the compiled network), are trained by
# tests/training (test_compiled_step.py, test_losses_training.py), and each loss's paper
# design is checked by tests/test_gpu_check.py.
SMOKE_TRAINED = (("ice", "eager"), ("rankmi", "compiled"))
SMOKE_SKIP = "not trained in --cpu-smoke (its config is built; it trains on a GPU run)"


def compile_setting(ctx: Context, step: str) -> str:
    """The trainer's ``compile`` for ``step``: off, or the check's mode. On the CPU (smoke)
    the compiled step traces with dynamo and AOTAutograd but skips inductor's code generation
    (minutes of C++ compiling for a self-test): :func:`smoke_compiler`."""
    return "off" if step == "eager" else ctx.compile_mode


@contextlib.contextmanager
def smoke_compiler(ctx: Context, step: str):
    """In --cpu-smoke, torch.compile with the aot_eager backend for the compiled step."""
    if not (ctx.smoke and step == "compiled"):
        yield
        return
    real = torch.compile

    def aot_eager(model, *, mode=None, **options):
        return real(model, backend="aot_eager", **options)

    torch.compile = aot_eager
    try:
        yield
    finally:
        torch.compile = real


def train_once(ctx: Context, loss: str, step: str, config) -> dict[str, Any]:
    """One trainer run of ``loss`` with the ``step`` variant: median images/s of the timed
    steps, peak memory, the profile of the batches after them, seconds in all."""
    from gpu_check_profile import StepProfiler, profiled_trainer

    from nearsight.training.run import train

    # the first variant's run is train/LOSS: the export part serves train/ice/best.pt
    out = ctx.workdir / "train" / (loss if step == ctx.train_steps[0] else f"{loss}-{step}")
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    critic_batches = 2 if loss == "rankmi" else 1  # RankMI: a critic batch after each step
    timed = ctx.sizes.train_steps + ctx.sizes.train_warmup
    profiler = StepProfiler(critic_batches * timed + 1, PROFILED_BATCHES, ctx.cuda)
    started = time.perf_counter()
    torch._dynamo.reset()  # each run compiles for itself: its time is the run's
    with profiled_trainer(profiler), smoke_compiler(ctx, step):
        train(config, out)
    seconds = time.perf_counter() - started
    records = read_jsonl(out / "train.jsonl")
    first = critic_batches * ctx.sizes.train_warmup
    timed_records = records[first : critic_batches * timed]
    return {
        "images_per_s": median([r["images_per_s"] for r in timed_records]),
        "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if ctx.cuda else None,
        "design": f"{config.sampler.classes_per_batch}x{config.sampler.per_class}",
        "profile": profiler.result,
        "seconds": round(seconds, 1),
    }


def run_train(ctx: Context, part: Part) -> None:
    from gpu_check_profile import describe

    from nearsight.training.losses import LOSSES

    ctx.require_gpu("training on the GPU")
    root = synthetic_jpegs(ctx)
    losses = list(ctx.train_losses or (*SEED_LOSSES, PROXY_BASELINE))
    unknown = [loss for loss in losses if loss not in LOSSES]
    if unknown:
        raise ValueError(f"unknown loss(es) {unknown}; valid: {sorted(LOSSES)}")
    # timed steps, then the profiled batches (RankMI: twice as many batches, a critic batch
    # after each step) and one to end the profile
    steps = ctx.sizes.train_steps + ctx.sizes.train_warmup + PROFILED_BATCHES + 1
    configs = {  # every eager run first: a check stopped by a time limit keeps them whole
        (loss, step): loss_config(ctx, loss, root, steps, compile=compile_setting(ctx, step))
        for step in ctx.train_steps
        for loss in losses
    }
    if ctx.smoke:
        for loss, step in [key for key in configs if key not in SMOKE_TRAINED]:
            del configs[loss, step]
            part.skip_row(f"{loss} step {step}", SMOKE_SKIP)
    designs = {
        loss: (c.sampler.classes_per_batch * c.sampler.per_class, c.model.dim)
        for (loss, _), c in configs.items()
    }
    for batch, dim in sorted(set(designs.values())):
        bare_images_per_s(ctx, batch, dim)  # before the runs; again after, the faster kept
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    failures = []
    started, longest = time.perf_counter(), 0.0
    for (loss, step), config in configs.items():
        if not ctx.smoke and time.perf_counter() - started + longest > TRAIN_BUDGET_S:
            part.skip_row(f"{loss} step {step}", f"the train part's {TRAIN_BUDGET_S} s are used")
            continue
        try:
            run = runs[loss, step] = train_once(ctx, loss, step, config)
        except Exception as error:  # one loss's failure must not hide the others' numbers
            failures.append(f"{loss} {step}: {type(error).__name__}: {error}"[:300])
            part.skip_row(f"{loss} step {step}", f"FAILED: {failures[-1]}")
            continue
        longest = max(longest, run["seconds"])
        part.progress(
            f"{loss} {step}: {run['images_per_s']:.1f} img/s in a {run['seconds']:.0f} s run; "
            f"{describe(run['profile'])}"
        )
    for batch, dim in sorted(set(designs.values())):
        bare_images_per_s(ctx, batch, dim)
    table = []
    for (loss, step), run in runs.items():
        batch, dim = designs[loss]
        bare = ctx.cache[("bare", batch, dim)]
        ratio = run["images_per_s"] / bare
        memory = f", peak {run['peak_gb']:.1f} GB" if run["peak_gb"] is not None else ""
        part.row(
            f"{loss} {run['design']}={batch}, dim {dim}, step {step}",
            round(run["images_per_s"], 1),
            "img/s",
            peer=round(bare, 1),
            ratio=round(ratio, 3),
            step=step,
            compile=configs[loss, step].compile,
            goal_ratio=BARE_RATIO_GOAL,
            meets_ratio_goal=ratio >= BARE_RATIO_GOAL,
            of_h200_goal=round(run["images_per_s"] / H200_GOAL_IMAGES_PER_S, 3),
            peak_gpu_gb=None if run["peak_gb"] is None else round(run["peak_gb"], 2),
            run_seconds=run["seconds"],
            profile=run["profile"],
            note=f"{describe(run['profile'])}{memory}",
        )
        table.append((loss, run["design"], batch, step, run["images_per_s"], bare, ratio))
    part.info["ratio_table"] = [
        dict(
            zip(
                ("loss", "design", "batch", "step", "images_per_s", "bare", "ratio"), r, strict=True
            )
        )
        for r in table
    ]
    print_ratio_table(table)
    ctx.cache["bare_best"] = max(v for k, v in ctx.cache.items() if k[0] == "bare")
    if failures:
        raise RuntimeError("; ".join(failures))


def print_ratio_table(table: list[tuple]) -> None:
    """The trainer against the bare forward+backward at its batch, one line per design/step."""
    lines = [
        "",
        f"train: trainer vs bare ResNet-50 fwd+bwd (goal >= {BARE_RATIO_GOAL} of bare, "
        f">= {H200_GOAL_IMAGES_PER_S:,.0f} img/s at batch >= 120)",
        f"  {'loss':<13} {'design':<10} {'step':<9} {'img/s':>8} {'bare':>8} {'ratio':>6}  goal",
    ]
    for loss, design, batch, step, rate, bare, ratio in table:
        goal = ratio >= BARE_RATIO_GOAL and (batch < 120 or rate >= H200_GOAL_IMAGES_PER_S)
        lines.append(
            f"  {loss:<13} {f'{design}={batch}':<10} {step:<9} {rate:>8.1f} {bare:>8.1f} "
            f"{ratio:>6.3f}  {'met' if goal else 'not met'}"
        )
    print("\n".join(lines) + "\n", flush=True)


# -- data loading alone ---------------------------------------------------------------------


def _loader(ctx: Context, root: Path, batch: int, per_class: int):
    from torch.utils.data import DataLoader

    from nearsight.data.datasets import load_dataset
    from nearsight.training.data import SeededBatches, SeededTrainDataset, collate
    from nearsight.training.samplers import build_sampler

    train = load_dataset("folder", str(root), "train")
    sampler = build_sampler("m_per_class", train.labels, seed=0, m=per_class, batch_size=batch)
    dataset = SeededTrainDataset(train.samples, ctx.sizes.image_size, (0.16, 1.0), True)
    loader = DataLoader(
        dataset,
        batch_sampler=SeededBatches(sampler, 0),
        num_workers=ctx.workers,
        collate_fn=collate,
        pin_memory=ctx.cuda,
    )
    return train, loader


def run_data(ctx: Context, part: Part) -> None:
    root = synthetic_jpegs(ctx)
    per_class = 2 if ctx.smoke else 4
    batch = 8 if ctx.smoke else 120
    train, loader = _loader(ctx, root, batch, per_class)
    wanted = ctx.sizes.data_batches
    start = time.perf_counter()
    first = None
    count = 0
    for i, (images, _) in enumerate(loader):
        if ctx.cuda:
            images = images.to("cuda", non_blocking=True)
        if i == 1:  # the workers are up and their prefetch is used: steady state from here
            first, count = time.perf_counter(), 0
        count += len(images)
        if i + 1 >= wanted:
            break
    ctx.synchronize()
    loader_rate = count / (time.perf_counter() - (first or start))
    bare = ctx.cache.get("bare_best")
    if bare is None and (ctx.cuda or ctx.smoke):
        bare = bare_images_per_s(ctx, batch, 512)
    part.row(
        f"DataLoader, {ctx.workers} workers, JPEG {ctx.sizes.image_size} px",
        round(loader_rate, 1),
        "img/s",
        peer=None if bare is None else round(bare, 1),
        bottleneck=None if bare is None else loader_rate < bare,
        note=(
            "no GPU peer here"
            if bare is None
            else ("loading is the bottleneck" if loader_rate < bare else "keeps up with the GPU")
        )
        + f"; {ctx.cores} cores",
    )
    if not (ctx.cuda or ctx.smoke):
        part.skip_row("GPU JPEG decode + crop", "needs a CUDA device")
        return
    rate = gpu_decode_images_per_s(ctx, [s.path for s in train.samples], batch)
    part.row(
        "decode_jpeg on the GPU + crop/flip (1 process)",
        round(rate, 1),
        "img/s",
        peer=None if bare is None else round(bare, 1),
        note="torchvision.io.decode_jpeg(device=...) on batches of file bytes",
    )


def gpu_decode_images_per_s(ctx: Context, paths: list[str], batch: int) -> float:
    """The fix if loading is the bottleneck: batched JPEG decoding on the GPU (nvJPEG through
    torchvision.io), then the random resized crop and flip on the GPU."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    from torchvision.transforms import v2

    crop = v2.Compose(
        [
            v2.RandomResizedCrop(ctx.sizes.image_size, scale=(0.16, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    )
    data = [read_file(p) for p in paths[: batch * 4]]  # bytes in memory: decoding is measured

    def one_batch(i: int) -> torch.Tensor:
        chunk = data[(i % 4) * batch : (i % 4 + 1) * batch]
        images = decode_jpeg(chunk, mode=ImageReadMode.RGB, device=ctx.device)
        return torch.stack([crop(image) for image in images]).float().div_(255)

    iterations = ctx.sizes.data_batches
    one_batch(0)
    ctx.synchronize()
    start = time.perf_counter()
    for i in range(iterations):
        one_batch(i)
    ctx.synchronize()
    return iterations * batch / (time.perf_counter() - start)


# -- resume ---------------------------------------------------------------------------------


@contextlib.contextmanager
def deterministic():
    """cuDNN/cuBLAS deterministic algorithms, so two identical runs are bit-identical."""
    previous = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
    )
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[:2]
        torch.use_deterministic_algorithms(previous[2])


def run_resume(ctx: Context, part: Part) -> None:
    """(Eager steps: the check is of the resumed state, and three compiles would triple its
    time; the train part measures the compiled step.)"""
    from nearsight.models.checkpoint import load_checkpoint
    from nearsight.training.run import train

    ctx.require_gpu("resume on the GPU")
    root = synthetic_jpegs(ctx)
    steps = ctx.sizes.resume_steps
    design = {"sampler.classes_per_batch": 4, "sampler.per_class": 2} if ctx.smoke else {}
    # last.pt at the half-way stop and at the end only: each save writes ~300 MB
    common = {"save_every": steps // 2, "optim.schedule": "constant", "compile": "off", **design}
    straight, resumed = ctx.workdir / "resume" / "straight", ctx.workdir / "resume" / "resumed"
    with deterministic():
        train(loss_config(ctx, "ice", root, steps, **common), straight)
        train(loss_config(ctx, "ice", root, steps // 2, **common), resumed)  # "killed" here
        train(loss_config(ctx, "ice", root, steps, **common), resumed, resume=True)
    a = [r["loss"] for r in read_jsonl(straight / "train.jsonl")]
    b = [r["loss"] for r in read_jsonl(resumed / "train.jsonl")]
    if len(a) != len(b):
        raise RuntimeError(f"the resumed run logged {len(b)} steps, the straight one {len(a)}")
    loss_diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
    weights_a = load_checkpoint(straight / "last.pt")["state_dict"]
    weights_b = load_checkpoint(resumed / "last.pt")["state_dict"]
    weight_diff = max(
        float((weights_a[k].double() - weights_b[k].double()).abs().max()) for k in weights_a
    )
    exact = loss_diff == 0.0 and weight_diff == 0.0
    part.row(
        f"ice, {steps} steps, stopped at {steps // 2} and resumed: max |loss diff|",
        loss_diff,
        "",
        exact=exact,
        note="bit-identical" if exact else "NOT identical",
    )
    part.row("max |weight diff| after the last step", weight_diff, "", exact=exact)
    if not exact:
        raise RuntimeError(
            f"resume on {ctx.device} is not exact: loss diff {loss_diff:.3g}, "
            f"weight diff {weight_diff:.3g}"
        )
