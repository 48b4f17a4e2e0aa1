"""The GPU path of nearsight in one command: training, data loading, export and serving,
search, evaluation and resume, each measured against a peer in the same process.

    python bench/gpu_check.py                      # every part, full size, on the CUDA GPU
    python bench/gpu_check.py --parts train,search --json gpu.json
    python bench/gpu_check.py --cpu-smoke          # every part at a tiny size on the CPU
    python bench/gpu_check.py --parts train --step both --json train.json   # the train part

Parts (``--parts``, comma-separated; default all):

  train   One short training run per seed loss (ice, rll, nra, rankmi, bcontrastive) and the
          proxy baseline (proxyanchor) through the real trainer: ResNet-50 at 224 px, each
          paper's batch design (nearsight/training/configs/*_cub.yaml), bf16 autocast and
          channels_last, synthetic JPEGs decoded by the trainer's DataLoader with one worker
          per core; each with the eager step and the compiled one (--step, --compile-mode).
          Images/s (median step after warm-up) against the bare ResNet-50 forward+backward on
          a batch already on the GPU, measured in the same process (goal: >= 0.9 of it, and
          >= 3,000 img/s at batches of 120 or more), peak GPU memory, and a torch.profiler
          breakdown of three batches after the timed ones (forward, loss, backward,
          optimiser, the device's idle share, the top kernels); a ratio table at the end.
  data    The training DataLoader alone (decode, random resized crop, flip, collate; one
          worker per core) in images/s, against the bare forward+backward: below it, loading
          is the bottleneck. Beside it, JPEG decoding on the GPU (torchvision.io.decode_jpeg
          with device='cuda', then the same crop on the GPU), the candidate fix, measured.
  export  ``nearsight export`` of a checkpoint, parity of onnxruntime's CUDA provider against
          torch on the GPU, and images/s at batch 1 and 64 of onnxruntime CUDA fp32 and fp16
          (and TensorRT when its provider starts) against torch eager (fp32, bf16) and
          torch.compile (bf16).
  search  FAISS flat and IVF (the gallery's own index builder) on 1M x 128: batch 1 latency
          and batch 1,024 throughput on the GPU (faiss.index_cpu_to_gpu) against the CPU.
  eval    The papers' evaluation (Recall@1/10/100/1000, NMI, MAP@R) of a 60k-item SOP-size
          gallery (11,316 classes) on the GPU against the CPU.
  resume  A short run on the GPU stopped half-way and resumed from last.pt, against the same
          run uninterrupted: every step's loss and the final weights must be identical
          (deterministic algorithms on, so that the comparison is bit for bit).
  timm    The timm backbones (bench/timm_backbones.py): for a CNN (ResNet-50), ConvNeXt-T and
          ViT-S/16, the training step of nearsight's network against the bare timm model on
          the GPU (bf16, batch 64; goal: >= 0.9 of it), and each one's ONNX export with its
          parity, int8 cosine and onnxruntime CPU images/s (fp32 and int8).

Without a CUDA device the GPU rows are skipped with the reason, and the CPU halves of data,
search and eval still run at full size. ``--cpu-smoke`` runs every part at a tiny size on the
CPU (GPU rows measured on the CPU instead; the train part trains ICE eager and RankMI compiled,
the timm part one family, the other rows skipped with the reason), to test the script itself.
Output: a table on stdout, ``--json FILE`` for the same as one JSON object; exit status 1 when
a part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

from gpu_check_common import Context, Part, Sizes, Skip  # noqa: E402

PART_NAMES = ("train", "data", "export", "search", "eval", "resume", "timm")


def part_functions() -> dict[str, Callable[[Context, Part], None]]:
    from gpu_check_search import run_eval, run_search
    from gpu_check_serving import run_export
    from gpu_check_timm import run_timm
    from gpu_check_train import run_data, run_resume, run_train

    return {
        "train": run_train,
        "data": run_data,
        "export": run_export,
        "search": run_search,
        "eval": run_eval,
        "resume": run_resume,
        "timm": run_timm,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--parts",
        default=",".join(PART_NAMES),
        help=f"comma-separated parts to run (default: all): {', '.join(PART_NAMES)}",
    )
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="every part at a tiny size on the CPU (tests the script; numbers mean nothing)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON here")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers (default: one per CPU core this process may use)",
    )
    parser.add_argument(
        "--step",
        choices=("eager", "compiled", "both"),
        default="both",
        help="train part: the trainer's step eager (compile: off), compiled (torch.compile of "
        "the network and the loss) or both, each profiled (default: both)",
    )
    parser.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"),
        help="train part: the compiled step's torch.compile mode (default: default)",
    )
    parser.add_argument(
        "--losses",
        metavar="LIST",
        help="train part: comma-separated losses (default: the six designs: ice, rll, nra, "
        "rankmi, bcontrastive, proxyanchor)",
    )
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep the synthetic data, runs and models here (default: a temporary folder)",
    )
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PART_NAMES))
    if unknown or not parts:
        parser.error(f"unknown part(s) {', '.join(unknown) or '(none)'}; valid: {PART_NAMES}")
    args.parts = [p for p in PART_NAMES if p in parts]
    if args.workers is not None and args.workers < 0:
        parser.error("--workers must be 0 or more")
    return args


def environment(ctx: Context) -> dict[str, Any]:
    import faiss
    import onnxruntime
    import torch
    import torchvision

    info: dict[str, Any] = {
        "device": ctx.device_name,
        "cpu_smoke": ctx.smoke,
        "cpu_cores": ctx.cores,
        "workers": ctx.workers,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torchvision": torchvision.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "faiss": faiss.__version__,
        "faiss_gpus": faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0,
    }
    if ctx.cuda:
        info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def run_parts(
    ctx: Context,
    names: list[str],
    after_part: Callable[[dict[str, dict[str, Any]]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each part in turn; ``after_part`` sees the results so far after each one (the JSON
    file is written as the parts finish: a check stopped from outside keeps its parts)."""
    functions = part_functions()
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        part = Part(name)
        start = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            functions[name](ctx, part)
            part.status = "ok"
        except Skip as skip:
            part.status, part.reason = "skipped", str(skip)
        except Exception as error:  # one broken part must not hide the others' numbers
            part.status = "failed"
            part.reason = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            traceback.print_exc(file=sys.stderr)
        part.seconds = round(time.perf_counter() - start, 1)
        results[name] = part.to_dict()
        print(f"   {name}: {part.status} in {part.seconds:.1f} s", file=sys.stderr, flush=True)
        if after_part is not None:
            after_part(results)
    return results


def format_number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e6:
            return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return f"{value:.2e}"
    return str(value)


def table(summary: dict[str, Any]) -> str:
    """The readable form: one line per measured row, one per skipped row or part."""
    env = summary["environment"]
    lines = [
        f"nearsight GPU check on {env['device']} (torch {env['torch']}, onnxruntime "
        f"{env['onnxruntime']}, faiss {env['faiss']}; {env['cpu_cores']} CPU cores)"
        + (
            "  [--cpu-smoke: tiny sizes on the CPU, numbers mean nothing]"
            if env["cpu_smoke"]
            else ""
        ),
        "",
        f"{'part':<7} {'what':<44} {'value':>11} {'unit':<9} {'peer':>11} {'ratio':>6}  note",
        "-" * 110,
    ]
    for name, part in summary["parts"].items():
        if part["status"] != "ok":
            lines.append(f"{name:<7} {part['status'].upper()}: {part['reason']}")
        for row in part["rows"]:
            if row.get("skipped"):
                lines.append(f"{name:<7} {row['name']:<44} skipped: {row['skipped']}")
                continue
            lines.append(
                f"{name:<7} {row['name']:<44} {format_number(row.get('value')):>11} "
                f"{row.get('unit', ''):<9} {format_number(row.get('peer')):>11} "
                f"{format_number(row.get('ratio')):>6}  {row.get('note', '')}".rstrip()
            )
    lines.append("-" * 110)
    seconds = sum(p["seconds"] for p in summary["parts"].values())
    failed = [n for n, p in summary["parts"].items() if p["status"] == "failed"]
    lines.append(
        f"{len(summary['parts'])} part(s) in {seconds:.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # resume: deterministic cuBLAS
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        ctx = Context.create(
            workdir, Sizes.smoke() if args.cpu_smoke else Sizes.full(), args.cpu_smoke, args.workers
        )
        ctx.train_steps = ("eager", "compiled") if args.step == "both" else (args.step,)
        ctx.compile_mode = args.compile_mode
        if args.losses:
            ctx.train_losses = tuple(x.strip() for x in args.losses.split(",") if x.strip())
        if ctx.note:
            print(f"nearsight: note: {ctx.note}", file=sys.stderr)
        env = environment(ctx)

        def write_partial(parts: dict[str, dict[str, Any]]) -> None:
            if args.json:
                partial = {"environment": env, "parts": parts, "partial": True}
                Path(args.json).write_text(json.dumps(partial, indent=2) + "\n")

        summary = {"environment": env, "parts": run_parts(ctx, args.parts, write_partial)}
    text = table(summary)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if any(p["status"] == "failed" for p in summary["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
