"""Static int8 quantisation of an exported nearsight model, checked against the fp32 one.

Decisions (see nearsight/models/export.py's docstring for the whole picture): onnxruntime's
``quantize_static``, QDQ format, per-channel int8 weights, uint8 activations, MinMax
calibration on test-transformed real images, after ``quant_pre_process``. The int8 model is a
second file beside the fp32 one; it fails below :data:`INT8_MIN_COSINE` mean cosine to fp32.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader
from PIL import Image

from nearsight.core.atomic import atomic_write_path
from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.models.embedder import INPUT_NAME, OnnxEmbedder
from nearsight.models.preprocess import test_transform

INT8_MIN_COSINE = 0.9  # mean cosine to fp32 below this: the int8 model is not worth keeping
CPU_ONLY = ["CPUExecutionProvider"]


def set_metadata(model: Any, metadata: dict[str, str]) -> None:
    """Replace an ONNX model's metadata_props with ``metadata`` (string values)."""
    del model.metadata_props[:]
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)


def _default_loader(path: Path) -> Image.Image:
    from PIL import ImageOps

    with Image.open(path) as image:
        return ImageOps.exif_transpose(image).convert("RGB")


def calibration_batch(
    paths: Sequence[str | os.PathLike[str]],
    image_size: int,
    resize: int,
    image_loader: Callable[[Path], Image.Image] | None,
    interpolation: str = "bilinear",
) -> np.ndarray:
    """The calibration images, test-transformed, [N, 3, S, S]; unreadable files are skipped."""
    loader = image_loader or _default_loader
    transform = test_transform(image_size, resize, interpolation)
    tensors, skipped = [], 0
    for path in paths:
        try:
            tensors.append(transform(loader(Path(path))))
        except (NearsightError, OSError, ValueError):
            skipped += 1
    if not tensors:
        raise NearsightError(f"none of the {len(paths)} calibration images could be read")
    return np.stack(tensors)


class _CalibrationReader(CalibrationDataReader):
    """onnxruntime's CalibrationDataReader over fixed batches of calibration images."""

    def __init__(self, images: np.ndarray, batch_size: int = 8) -> None:
        self.batches = [images[i : i + batch_size] for i in range(0, len(images), batch_size)]
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.batches):
            return None
        self.position += 1
        return {INPUT_NAME: np.ascontiguousarray(self.batches[self.position - 1])}

    def rewind(self) -> None:
        self.position = 0


@dataclass
class Int8Report:
    """What ``quantize_int8`` wrote and measured."""

    path: Path
    model_sha256: str
    size_bytes: int
    calibration_images: int
    cosine_mean: float  # cosine of int8 to fp32 embeddings on the calibration images
    cosine_min: float


def quantize_int8(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    calibration: Sequence[str | os.PathLike[str]],
    *,
    image_loader: Callable[[Path], Image.Image] | None = None,
) -> Int8Report:
    """Write the static-int8 copy of the fp32 nearsight model ``model`` to ``out``, calibrated
    on the images at ``calibration`` (read by ``image_loader``, then test-transformed)."""
    model, out = Path(model), Path(out)
    fp32 = OnnxEmbedder(model, providers=CPU_ONLY)  # refuses a file that is not a nearsight model
    if fp32.metadata.get("precision", "fp32") != "fp32":
        raise NearsightError(
            f"{model} is already {fp32.metadata['precision']}; give the fp32 model"
        )
    if out.resolve() == model.resolve():
        raise NearsightError(f"the int8 model needs its own file, not {model}")
    if not calibration:
        raise NearsightError("int8 quantisation needs calibration images, got none")
    images = calibration_batch(
        calibration, fp32.image_size, fp32.resize, image_loader, fp32.interpolation
    )
    with atomic_write_path(out) as tmp:
        return write_int8(model, tmp, out, images, fp32.metadata, fp32.model_sha256, model)


def write_int8(
    fp32_path: Path,
    tmp: Path,
    final: Path,
    images: np.ndarray,
    metadata: dict[str, str],
    fp32_sha256: str,
    source: Path,
) -> Int8Report:
    """Quantise ``fp32_path`` into ``tmp`` (to be renamed to ``final``) and check it."""
    cosines = _quantize(fp32_path, tmp, images, metadata, fp32_sha256)
    if not cosines.mean() >= INT8_MIN_COSINE:  # also catches NaN
        raise NearsightError(
            f"int8 quantisation of {source} lost too much: mean cosine to fp32 "
            f"{cosines.mean():.3f} < {INT8_MIN_COSINE} on {len(cosines)} calibration images; "
            "nothing written"
        )
    return Int8Report(
        path=final,
        model_sha256=file_sha256(tmp),
        size_bytes=tmp.stat().st_size,
        calibration_images=len(cosines),
        cosine_mean=float(cosines.mean()),
        cosine_min=float(cosines.min()),
    )


def _quantize(
    fp32_path: Path,
    int8_path: Path,
    images: np.ndarray,
    metadata: dict[str, str],
    fp32_sha256: str,
) -> np.ndarray:
    """Write the QDQ int8 model; return each calibration image's cosine to the fp32 model."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="nearsight-int8-") as work:
        prepared = Path(work) / "prepared.onnx"
        quant_pre_process(str(fp32_path), str(prepared))
        quantize_static(
            str(prepared),
            str(int8_path),
            _CalibrationReader(images),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            # U8S8: uint8 activations, int8 weights. onnxruntime's x86 int8 kernels are built
            # for it (VNNI); S8S8 was slower (docs/decisions.md).
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            calibration_providers=CPU_ONLY,
        )
    model = onnx.load(str(int8_path))
    set_metadata(
        model,
        {
            **metadata,
            "precision": "int8",
            "int8_calibration_images": str(len(images)),
            "fp32_model_sha256": fp32_sha256,
        },
    )
    onnx.save_model(model, str(int8_path), save_as_external_data=False)

    fp32 = OnnxEmbedder(fp32_path, providers=CPU_ONLY)
    int8 = OnnxEmbedder(int8_path, providers=CPU_ONLY)
    cosines = []
    for start in range(0, len(images), 16):
        batch = images[start : start + 16]
        cosines.append(np.sum(fp32.embed(batch) * int8.embed(batch), axis=1))
    return np.concatenate(cosines)
