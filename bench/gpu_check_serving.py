"""bench/gpu_check.py part ``export``: ``nearsight export``, parity of onnxruntime's CUDA
provider against torch on the GPU, and serving images/s of onnxruntime (CUDA fp32/fp16,
TensorRT when it starts) against torch eager and torch.compile at batch 1 and 64."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpu_check_common import Context, Part, median, time_calls

from nearsight.models.embedder import INPUT_NAME, OUTPUT_NAME, OnnxEmbedder

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"


def checkpoint_for_export(ctx: Context) -> Path:
    """The ICE run of the train part when it ran, else a freshly initialised network."""
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

    trained = ctx.workdir / "train" / "ice" / "best.pt"
    if trained.exists():
        return trained
    path = ctx.workdir / "serve" / "untrained.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = build_embedding_net(EmbeddingConfig(dim=128, image_size=ctx.sizes.image_size))
    return save_checkpoint(path, net)


def providers(ctx: Context, name: str, **options: Any) -> list[Any]:
    if not ctx.cuda:
        return [CPU]
    return [(name, options), CPU] if name == TENSORRT else [(CUDA, options), CPU]


@contextlib.contextmanager
def quiet_onnxruntime():
    """A provider that cannot start (TensorRT without its libraries) logs errors; the row
    says so instead."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)


def ort_call(ctx: Context, embedder: OnnxEmbedder, images: np.ndarray) -> Callable[[], Any]:
    """One inference of ``images``; on CUDA with the input already on the GPU (I/O binding),
    as torch's peer has it."""
    import onnxruntime as ort

    session = embedder.session
    if embedder.device != "cuda":
        return lambda: session.run([OUTPUT_NAME], {INPUT_NAME: images})
    value = ort.OrtValue.ortvalue_from_numpy(images, "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input(INPUT_NAME, value)

    def call() -> Any:
        binding.bind_output(OUTPUT_NAME, "cuda")
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]

    return call


def fp16_model(source: Path, out: Path) -> Path:
    """The fp32 model converted to fp16 inside (inputs and outputs stay float32), with
    onnxruntime's own converter."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(model, str(out))
    return out


def run_export(ctx: Context, part: Part) -> None:
    from nearsight.models.checkpoint import load_embedding_net
    from nearsight.models.export import PARITY_TOLERANCE, export_onnx

    ctx.require_gpu("export parity and serving on the GPU")
    folder = ctx.workdir / "serve"
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = checkpoint_for_export(ctx)
    report = export_onnx(checkpoint, folder / "model.onnx")
    part.row(
        "nearsight export: max |torch - onnxruntime CPU|",
        report.max_abs_diff,
        "",
        note=f"{report.seconds:.1f} s; tolerance {PARITY_TOLERANCE:g}",
    )
    size = ctx.sizes.image_size
    batches = ctx.sizes.serve_batches
    generator = torch.Generator().manual_seed(0)
    images = {b: torch.rand(b, 3, size, size, generator=generator) for b in batches}
    net = load_embedding_net(checkpoint, map_location=ctx.device).eval()
    sessions = ort_sessions(ctx, part, report.path, net, images[batches[-1]], folder)
    # torch eager fp32 first: it is every later row's peer
    runners: dict[str, Callable[[torch.Tensor], Callable[[], Any] | str]] = {}
    runners.update(torch_runners(ctx, net))
    for name, embedder in sessions.items():
        runners[name] = lambda x, e=embedder: ort_call(ctx, e, x.numpy())

    peers: dict[int, float] = {}
    for name, make in runners.items():
        for batch in batches:
            start = time.perf_counter()
            call = make(images[batch])
            if isinstance(call, str):  # a reason to skip
                part.skip_row(f"{name}, batch {batch}", call)
                continue
            setup = time.perf_counter() - start
            times = time_calls(ctx, call, ctx.sizes.serve_iterations[batch])
            rate = batch / median(times)
            if name == "torch eager fp32":
                peers[batch] = rate
            part.row(
                f"{name}, batch {batch}",
                round(rate, 1),
                "img/s",
                peer=round(peers[batch], 1) if batch in peers else None,
                note=f"p50 {1000 * median(times):.2f} ms"
                + (f"; compile {setup:.0f} s" if "compile" in name else ""),
            )


def ort_sessions(
    ctx: Context, part: Part, model: Path, net: torch.nn.Module, big: torch.Tensor, folder: Path
) -> dict[str, OnnxEmbedder]:
    """onnxruntime's parity against torch on the device and its serving sessions (CUDA fp32,
    fp16, TensorRT); none when its CUDA provider does not start (a CPU-only onnxruntime), so
    that the torch rows are still measured."""
    from nearsight.models.export import PARITY_TOLERANCE

    # parity on the GPU: both sides in true fp32 (no TF32)
    fp32 = OnnxEmbedder(model, providers=providers(ctx, CUDA, use_tf32="0"))
    if ctx.cuda and fp32.device != "cuda":
        part.skip_row(
            "onnxruntime CUDA (parity, fp32, fp16, TensorRT)",
            f"the CUDA provider did not start ({fp32.providers}); torch rows only",
        )
        return {}
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    with torch.inference_mode():
        reference = net(big.to(ctx.device)).float().cpu().numpy()
    torch.backends.cudnn.allow_tf32 = tf32
    diff = float(np.abs(ort_call(ctx, fp32, big.numpy())() - reference).max())
    part.row(
        f"parity onnxruntime {fp32.device} vs torch {ctx.device}, batch {len(big)}",
        diff,
        "max|diff|",
        within_tolerance=diff <= PARITY_TOLERANCE,
        note=f"fp32 both (TF32 off); tolerance {PARITY_TOLERANCE:g}",
    )
    sessions = {"onnxruntime fp32": OnnxEmbedder(model, providers=providers(ctx, CUDA))}
    try:
        path16 = fp16_model(model, folder / "model.fp16.onnx")
        sessions["onnxruntime fp16"] = OnnxEmbedder(path16, providers=providers(ctx, CUDA))
    except Exception as error:  # the converter or the provider refused it
        part.skip_row("onnxruntime fp16", f"{type(error).__name__}: {str(error)[:150]}")
    trt_reason = tensorrt_reason(ctx)
    if trt_reason:
        part.skip_row("onnxruntime TensorRT fp16", trt_reason)
        return sessions
    options = {"trt_fp16_enable": True, "trt_engine_cache_enable": True}
    options["trt_engine_cache_path"] = str(folder / "trt")
    with quiet_onnxruntime():
        trt = OnnxEmbedder(model, providers=providers(ctx, TENSORRT, **options))
    if TENSORRT in trt.providers:
        sessions["onnxruntime TensorRT fp16"] = trt
    else:
        part.skip_row("onnxruntime TensorRT fp16", "the TensorRT provider did not start")
    return sessions


def tensorrt_reason(ctx: Context) -> str | None:
    import onnxruntime as ort

    if not ctx.cuda:
        return "needs a CUDA device"
    if TENSORRT not in ort.get_available_providers():
        return "this onnxruntime build has no TensorRT provider"
    return None


def torch_runners(ctx: Context, net: torch.nn.Module) -> dict[str, Callable]:
    """torch eager fp32 (the peer), eager bf16 + channels_last (how the trainer runs), and
    torch.compile of the latter."""
    device = ctx.device

    def eager(x: torch.Tensor, model: torch.nn.Module = net, bf16: bool = False):
        x = x.to(device)
        if bf16 and ctx.cuda:
            x = x.contiguous(memory_format=torch.channels_last)

        def call():
            with torch.inference_mode(), torch.autocast(device, torch.bfloat16, enabled=bf16):
                return model(x)

        return call

    fast = net
    if ctx.cuda:
        import copy

        fast = copy.deepcopy(net).to(memory_format=torch.channels_last)
    runners: dict[str, Callable] = {
        "torch eager fp32": eager,
        "torch eager bf16": lambda x: eager(x, fast, True),
    }
    if not ctx.sizes.compile:
        runners["torch.compile bf16"] = lambda x: "skipped in --cpu-smoke (minutes of compiling)"
        return runners
    compiled = torch.compile(fast, dynamic=False)

    def compiled_runner(x: torch.Tensor):
        call = eager(x, compiled, True)
        call()  # compile for this shape here, so that setup time is reported apart
        return call

    runners["torch.compile bf16"] = compiled_runner
    return runners
