"""Where the trainer's step time goes, per loss, on the GPU: torch.profiler over steady-state
steps of the real trainer with bench/gpu_check.py's train configurations (each paper's CUB
batch design, 224 px, bf16 autocast, channels_last, frozen BatchNorm as the configs say).

    python bench/gpu_profile.py OUT_DIR [--losses ice,rll] [--smoke]

Per loss: GPU kernel time per step (the sum of self CUDA time), how much of it is batch norm
and the casts around it and how much is convolution, kernels launched per step, host syncs
per step (``.item()``, stream synchronisations, device-to-host copies) and the step's wall
time under the profiler (which inflates host time: compare wall times without it, from
bench/gpu_check.py). Writes ``profile_<loss>.txt`` (the profiler's tables) and
``profile_summary.json`` into OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

import torch  # noqa: E402
from gpu_check_common import Context, Sizes, synthetic_jpegs  # noqa: E402
from gpu_check_train import PROXY_BASELINE, SEED_LOSSES, loss_config  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

BATCH_NORM_OPS = ("aten::native_batch_norm_backward", "aten::native_batch_norm", "aten::copy_")
CONVOLUTION_OPS = ("aten::cudnn_convolution", "aten::convolution_backward")
SYNC_OPS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaMemcpyAsync")
# the embedding network's optimiser has the trunk's ~160 tensors; RankMI's critic has a few
TRUNK_PARAMETERS = 50


def profile_loss(ctx: Context, loss: str, root: Path, out: Path, window: tuple[int, int, int]):
    wait, warm, active = window
    config = loss_config(ctx, loss, root, wait + warm + active + 2)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=warm, active=active, repeat=1),
    )
    stamps: list[float] = []

    def after_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if len(optimizer.param_groups[0]["params"]) < TRUNK_PARAMETERS:
            return
        ctx.synchronize()
        stamps.append(time.perf_counter())
        profiler.step()

    from nearsight.training.run import train

    handle = register_optimizer_step_post_hook(after_step)
    profiler.start()
    try:
        train(config, ctx.workdir / "profile" / loss)
    finally:
        handle.remove()
        profiler.stop()
    steps = min(active, len(stamps) - wait - warm - 1)
    table = profiler.key_averages()
    self_device = {e.key: e.self_device_time_total / 1e3 for e in table}
    device_total = {e.key: e.device_time_total / 1e3 for e in table}
    calls = {e.key: e.count for e in table}
    gpu_ms = sum(v for k, v in self_device.items() if not k.startswith("ProfilerStep"))
    norm_ms = sum(self_device.get(k, 0.0) for k in BATCH_NORM_OPS)
    conv_ms = self_device.get(CONVOLUTION_OPS[0], 0.0) + device_total.get(CONVOLUTION_OPS[1], 0.0)
    kernels = sum(1 for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    first = wait + warm
    wall_ms = (stamps[first + steps] - stamps[first]) / steps * 1e3
    batch = config.sampler.classes_per_batch * config.sampler.per_class
    sort = "self_cuda_time_total" if ctx.cuda else "self_cpu_time_total"
    (out / f"profile_{loss}.txt").write_text(
        table.table(sort_by="self_cpu_time_total", row_limit=40)
        + "\n\n"
        + table.table(sort_by=sort, row_limit=40)
    )
    return {
        "design": f"{config.sampler.classes_per_batch}x{config.sampler.per_class}",
        "batch": batch,
        "dim": config.model.dim,
        "steps_profiled": steps,
        "gpu_kernel_ms_per_step": round(gpu_ms / steps, 2),
        "batch_norm_and_casts_ms_per_step": round(norm_ms / steps, 2),
        "batch_norm_and_casts_share_of_gpu": round(norm_ms / gpu_ms, 3) if gpu_ms else None,
        "convolution_ms_per_step": round(conv_ms / steps, 2),
        "kernels_per_step": round(kernels / steps, 1),
        "host_syncs_per_step": {k: round(calls.get(k, 0) / steps, 1) for k in SYNC_OPS},
        "step_wall_ms_under_profiler": round(wall_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--losses", default=",".join((*SEED_LOSSES, PROXY_BASELINE)))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = Sizes.smoke() if args.smoke else Sizes.full()
    window = (1, 1, 2) if args.smoke else (8, 2, 10)
    sizes.train_steps, sizes.train_warmup = sum(window) + 2, 0
    ctx = Context.create(args.out / "work", sizes, args.smoke, None)
    root = synthetic_jpegs(ctx)
    summary: dict[str, Any] = {"device": ctx.device_name, "torch": torch.__version__}
    for loss in args.losses.split(","):
        summary[loss] = profile_loss(ctx, loss, root, args.out, window)
        print(loss, json.dumps(summary[loss]), flush=True)
        (args.out / "profile_summary.json").write_text(json.dumps(summary, indent=1))
        if ctx.cuda:
            torch.cuda.empty_cache()
    print("loss design gpu_ms/step bn_ms/step bn_share conv_ms kernels/step item/step wall_ms")
    for loss in args.losses.split(","):
        r = summary[loss]
        print(
            loss,
            r["design"],
            r["gpu_kernel_ms_per_step"],
            r["batch_norm_and_casts_ms_per_step"],
            r["batch_norm_and_casts_share_of_gpu"],
            r["convolution_ms_per_step"],
            r["kernels_per_step"],
            r["host_syncs_per_step"]["aten::_local_scalar_dense"],
            r["step_wall_ms_under_profiler"],
        )


if __name__ == "__main__":
    main()
