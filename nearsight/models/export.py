"""ONNX export of a checkpoint, checked against torch, with optional static int8 quantisation.

The model file (DESIGN.md "Artifacts"): ONE ``.onnx`` file (no external data), input
``images`` float32 [N, 3, H, W] RGB in [0, 1] with ImageNet normalisation inside the graph
(it is inside ``EmbeddingNet.forward``), output ``embeddings`` [N, D] L2-normalised, dynamic N,
and the string metadata of :data:`nearsight.models.embedder.METADATA_KEYS` (the model spec as JSON, loss,
training dataset, checkpoint sha256, nearsight version, opset...).

Decisions
- Exporter: the TorchScript-based one (``torch.onnx.export(..., dynamo=False)``). torch 2.9+
  defaults to the dynamo exporter, which needs the ``onnxscript`` package (not a nearsight
  dependency and not installed here); the TorchScript exporter needs nothing more, writes one
  file for models under 2 GB, folds BatchNorm into the convolutions in eval mode, and gives
  parity far inside the 1e-4 limit on ResNets (docs/decisions.md). Its deprecation warning is
  silenced; if a future torch drops it, moving to ``dynamo=True`` (plus ``onnxscript``) is a
  local change here.
- Opset 17 (default): inside both the TorchScript exporter's range (<= 20) and onnxruntime's
  (1.31 runs up to 23), and old enough for other runtimes (TensorRT 8.6, ORT >= 1.13).
- Parity: torch vs onnxruntime (CPU) on a seeded random batch of ``batch_for_check`` images and
  on a batch of 1 (which also proves N is dynamic); above 1e-4 the export fails and no file is
  left (everything is written beside ``out`` under a temporary name and renamed at the end).
- int8: static quantisation (``onnxruntime.quantization.quantize_static``), QDQ format,
  per-channel int8 weights, uint8 activations (U8S8, the fast path of onnxruntime's x86 int8
  kernels; S8S8 was slower, docs/decisions.md) calibrated (MinMax) on test-transformed real
  images. It is meant for CPU serving. It runs on the output of ``quant_pre_process`` (shape
  inference + onnxruntime graph optimisation: Identity removal, constant folding; the BatchNorms
  are already fused by the exporter), as onnxruntime recommends. It is written as a SECOND file
  beside the fp32 one, ``<stem>.int8.onnx`` (``model.onnx`` -> ``model.int8.onnx``), so the fp32
  model stays the reference; its parity is the cosine similarity of its embeddings to the fp32
  model's on the calibration images (it fails below :data:`INT8_MIN_COSINE` on average).
  :func:`quantize_int8` does the same for an fp32 model already exported.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from PIL import Image

from nearsight.core.atomic import atomic_write_path
from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import checkpoint_sha256, load_checkpoint, load_embedding_net
from nearsight.models.embedder import (
    INPUT_NAME,
    OUTPUT_NAME,
    OnnxEmbedder,
    checkpoint_metadata,
    file_sha256,
)
from nearsight.models.embedding import EmbeddingNet
from nearsight.models.quantize import (  # noqa: F401  (quantize_int8, Int8Report re-exported)
    CPU_ONLY,
    INT8_MIN_COSINE,
    Int8Report,
    calibration_batch,
    quantize_int8,
    set_metadata,
    write_int8,
)
from nearsight.models.spec import spec_from_checkpoint

DEFAULT_OPSET = 17
MIN_OPSET = 13  # per-channel QuantizeLinear (int8) and ReduceL2 as exported need >= 13
MAX_OPSET = 20  # the TorchScript exporter's newest
PARITY_TOLERANCE = 1e-4
EXPORTER = "torchscript"


@dataclass
class ExportReport:
    """What ``export_onnx`` wrote and measured."""

    path: Path
    opset: int
    exporter: str
    max_abs_diff: float  # max |torch - onnxruntime| over the parity batches
    parity_batches: tuple[int, ...]
    dim: int
    image_size: int
    resize: int
    checkpoint_sha256: str
    model_sha256: str  # sha256 of the written .onnx file (what galleries record)
    size_bytes: int
    seconds: float
    int8: Int8Report | None = None  # the int8 copy, when one was asked for

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON values, the int8 copy's fields flat as ``int8_*`` (None, and 0
        calibration images, without one)."""
        values = asdict(self)
        del values["int8"]
        values["path"] = str(self.path)
        values["parity_batches"] = list(self.parity_batches)
        int8 = self.int8
        values.update(
            int8_path=None if int8 is None else str(int8.path),
            int8_model_sha256=None if int8 is None else int8.model_sha256,
            int8_size_bytes=None if int8 is None else int8.size_bytes,
            int8_calibration_images=0 if int8 is None else int8.calibration_images,
            int8_cosine_mean=None if int8 is None else int8.cosine_mean,
            int8_cosine_min=None if int8 is None else int8.cosine_min,
        )
        return values


def default_int8_path(out: str | os.PathLike[str]) -> Path:
    """``model.onnx`` -> ``model.int8.onnx`` (beside it)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.int8{out.suffix or '.onnx'}")


def pick_calibration_paths(paths: Sequence[Path], count: int) -> list[Path]:
    """``count`` paths spread evenly over ``paths`` (a dataset sorted by class covers many
    classes, not the first few), deterministic."""
    if count <= 0:
        raise NearsightError(f"calibration images must be positive, got {count}")
    if len(paths) <= count:
        return list(paths)
    step = len(paths) / count
    return [paths[int(i * step)] for i in range(count)]


def export(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    parity_batch: int = 4,
    int8_calibration: Sequence[str | os.PathLike[str]] | None = None,
    int8_out: str | os.PathLike[str] | None = None,
    image_loader: Callable[[Path], Image.Image] | None = None,
    log: Callable[[str], None] | None = None,
) -> ExportReport:
    """Export a checkpoint (a ``.pt`` file, or a run folder: its ``best.pt``) to the ONNX file
    ``out`` (``.onnx``), parity-checked against torch; with ``int8_calibration`` (image paths)
    also its int8 copy (``int8_out``, default ``<stem>.int8.onnx``). What ``nearsight.export``
    and ``nearsight export`` call; see :func:`export_onnx` for the steps."""
    checkpoint, out = Path(checkpoint), Path(out)
    if checkpoint.is_dir():
        checkpoint = checkpoint / "best.pt"
    if out.suffix.lower() != ".onnx":
        raise NearsightError(f"the model to write must be a .onnx file, got {out}")
    if int8_out is not None and int8_calibration is None:
        raise NearsightError("an int8 file was named but no calibration images were given")
    return export_onnx(
        checkpoint,
        out,
        opset=opset,
        batch_for_check=parity_batch,
        int8_calibration=int8_calibration,
        int8_out=int8_out,
        image_loader=image_loader,
        log=log,
    )


def export_onnx(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    batch_for_check: int = 4,
    int8_calibration: Sequence[str | os.PathLike[str]] | None = None,
    int8_out: str | os.PathLike[str] | None = None,
    image_loader: Callable[[Path], Image.Image] | None = None,
    log: Callable[[str], None] | None = None,
) -> ExportReport:
    """Export ``checkpoint`` to the one-file ONNX model ``out`` and check it against torch.

    With ``int8_calibration`` (image paths), also write the static-int8 model ``int8_out``
    (default :func:`default_int8_path`), calibrated on those images read by ``image_loader``
    (default: PIL, EXIF-oriented, RGB). Both files appear together or not at all. ``log``
    receives a line as each stage starts (the CLI prints them)."""
    log = log or (lambda line: None)
    start = time.perf_counter()
    checkpoint, out = Path(checkpoint), Path(out)
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise NearsightError(
            f"opset must be an integer from {MIN_OPSET} to {MAX_OPSET}, got {opset!r}"
        )
    if batch_for_check < 1:
        raise NearsightError(f"the parity batch must hold at least 1 image, got {batch_for_check}")
    if out.is_dir():
        raise NearsightError(f"--out {out} is a folder; give the .onnx file to write")
    int8_path = None
    if int8_calibration is not None:
        int8_path = Path(int8_out) if int8_out is not None else default_int8_path(out)
        if int8_path.resolve() == out.resolve():
            raise NearsightError(f"the int8 model needs its own file, not {out}")
        if not int8_calibration:
            raise NearsightError("int8 quantisation needs calibration images, got none")

    payload = load_checkpoint(checkpoint)  # one-line errors: missing, foreign, damaged
    net = load_embedding_net(checkpoint)
    net.eval().fold_feature_norm()  # one Gemm head, as the papers; tests check the fold
    sha = checkpoint_sha256(checkpoint)
    metadata = checkpoint_metadata(payload, sha)
    metadata["opset"] = str(opset)
    spec = spec_from_checkpoint(payload)
    image_size, resize = spec.image_size, spec.test_resize
    # images first: an unreadable calibration set fails before minutes of export
    calibration = (
        calibration_batch(int8_calibration, image_size, resize, image_loader, spec.interpolation)
        if int8_calibration is not None
        else None
    )

    with atomic_write_path(out) as tmp:
        log(f"exporting {checkpoint} ({net.config.arch}, {image_size} px, opset {opset})")
        _torch_export(net, tmp, opset)
        _finish_model(tmp, metadata, net.dim)
        batches = (batch_for_check, 1) if batch_for_check != 1 else (1,)
        log(f"parity check: torch vs onnxruntime on batches of {' and '.join(map(str, batches))}")
        max_diff = _parity(net, tmp, batches)
        if math.isnan(max_diff):
            raise NearsightError(
                f"{checkpoint} gives NaN or infinite embeddings (broken weights: did its "
                "training diverge?); nothing written"
            )
        if not max_diff <= PARITY_TOLERANCE:
            raise NearsightError(
                f"ONNX export of {checkpoint} failed its parity check: max |torch - onnxruntime| "
                f"= {max_diff:.3g} > {PARITY_TOLERANCE:g}; nothing written"
            )
        report = ExportReport(
            path=out,
            opset=opset,
            exporter=EXPORTER,
            max_abs_diff=max_diff,
            parity_batches=batches,
            dim=net.dim,
            image_size=image_size,
            resize=resize,
            checkpoint_sha256=sha,
            model_sha256=file_sha256(tmp),
            size_bytes=tmp.stat().st_size,
            seconds=0.0,
        )
        if calibration is not None and int8_path is not None:
            log(f"int8: calibrating and quantising on {len(calibration)} images")
            with atomic_write_path(int8_path) as tmp_int8:
                report.int8 = write_int8(
                    tmp, tmp_int8, int8_path, calibration, metadata, report.model_sha256, checkpoint
                )
    report.seconds = time.perf_counter() - start
    return report


def _torch_export(net: EmbeddingNet, path: Path, opset: int) -> None:
    example = torch.rand(2, 3, net.config.image_size, net.config.image_size)
    with warnings.catch_warnings():
        # "legacy TorchScript-based ONNX export" / "The feature will be removed": chosen on
        # purpose (see the module docstring)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        # timm's shape checks read tensor sizes as Python values while tracing; the parity
        # check on two batch sizes below proves the graph right for any N
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            _ServedEmbedding(net).eval(),
            (example,),
            str(path),
            dynamo=False,
            export_params=True,
            opset_version=opset,
            do_constant_folding=True,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "N"}, OUTPUT_NAME: {0: "N"}},
        )


class _ServedEmbedding(torch.nn.Module):
    """``images -> net(images)``, the served embedding (last head or concat) alone: the
    tracer would otherwise turn forward's ``all_heads`` flag into a graph input."""

    def __init__(self, net: EmbeddingNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


def _finish_model(path: Path, metadata: dict[str, str], dim: int) -> None:
    """Add the metadata, give the output its static width D, check, and keep ONE file."""
    model = onnx.load(str(path))
    output_dims = model.graph.output[0].type.tensor_type.shape.dim
    if len(output_dims) == 2:  # the exporter leaves D symbolic after the L2 normalisation
        output_dims[1].ClearField("dim_param")
        output_dims[1].dim_value = dim
    set_metadata(model, metadata)
    model.doc_string = (
        "nearsight embedding model: images [N,3,H,W] RGB in [0,1] -> embeddings [N,D], unit L2 norm"
    )
    onnx.checker.check_model(model)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise NearsightError("the exported model has external data; nearsight writes one file")
    onnx.save_model(model, str(path), save_as_external_data=False)


def _parity(net: EmbeddingNet, path: Path, batches: Sequence[int]) -> float:
    """max |torch - onnxruntime(CPU)| over seeded random batches of the given sizes."""
    embedder = OnnxEmbedder(path, providers=CPU_ONLY)
    generator = torch.Generator().manual_seed(0)
    size = net.config.image_size
    worst = 0.0
    for count in batches:
        images = torch.rand(count, 3, size, size, generator=generator)
        with torch.inference_mode():
            expected = net(images).numpy()
        if not np.isfinite(expected).all():
            return float("nan")  # broken weights; max() below would drop a NaN difference
        got = embedder.embed(images)
        if got.shape != expected.shape:
            return float("inf")
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst
