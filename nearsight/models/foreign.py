"""Embedding models exported elsewhere: any ONNX graph that maps an NCHW float image batch to
one embedding per image (a CLIP or DINOv2 image tower, a torchvision trunk), without
nearsight's metadata.

Such a model is described by a :class:`~nearsight.models.spec.ModelSpec` whose ``input_name``,
``output_name``, ``mean`` and ``std`` are set (:func:`foreign_spec` reads the graph and fills
them in). Galleries record that spec as they do a nearsight model's, so searching, serving and
evaluating a gallery need nothing more than its folder. Images get nearsight's test transform
(resize the short side, centre crop, [0, 1]), then ``(x - mean) / std`` here; the output is
flattened per image and L2-normalised here (FAISS compares unit vectors). No torch.

Before anything is embedded, :func:`foreign_spec` checks the graph's declared output and then
runs it on one blank image (and on two, when its batch is not fixed): the output must keep the
batch dimension, one embedding of at most :data:`MAX_EMBEDDING_DIM` values per image, and a
fixed batch may be at most :data:`MAX_FIXED_BATCH`. Anything else is a one-line error before
a file is written (a 60M-value output took 11.6 GB and left 10.8 GB of chunks on disk).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.models.embedder import MODEL_FORMAT, OnnxEmbedder
from nearsight.models.onnx_session import open_session
from nearsight.models.preprocess import IMAGENET_MEAN, IMAGENET_STD, test_transform
from nearsight.models.spec import ModelSpec

MAX_EMBEDDING_DIM = 65_536  # values per image (CLIP and DINOv2 towers give 512 to 1,536)
MAX_FIXED_BATCH = 256  # a graph exported for a fixed batch is padded to it on every call


def _image_input(session: Any, path: Path) -> Any:
    inputs = session.get_inputs()
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        described = ", ".join(f"{i.name} {list(i.shape)}" for i in inputs)
        raise NearsightError(
            f"{path}: expected one image input [N, 3, H, W], the graph takes {described}"
        )
    return inputs[0]


def _output(session: Any, path: Path, output: str | None) -> str:
    names = [o.name for o in session.get_outputs()]
    if output is None:
        return names[0]
    if output not in names:
        raise NearsightError(f"{path} has no output {output!r}; its outputs: {', '.join(names)}")
    return output


def fixed_batch(session: Any, path: Path = Path("model")) -> int | None:
    """The batch size a graph exported without a dynamic batch axis insists on, else None;
    NearsightError past :data:`MAX_FIXED_BATCH`."""
    first = _image_input(session, path).shape[0]
    fixed = first if isinstance(first, int) and first > 0 else None
    if fixed is not None and fixed > MAX_FIXED_BATCH:
        raise NearsightError(
            f"{path} takes batches of exactly {fixed:,} images, more than the {MAX_FIXED_BATCH} "
            "nearsight runs (export it with a dynamic batch axis)"
        )
    return fixed


def _check_declared_output(session: Any, path: Path, name: str) -> None:
    """The graph's own description of ``name``: a batch axis, and (where it fixes them) at
    most :data:`MAX_EMBEDDING_DIM` values per image; checked before anything runs."""
    shape = list(next(o for o in session.get_outputs() if o.name == name).shape or [])
    if not shape:
        return  # no shape recorded: the probe run tells
    if len(shape) < 2:
        raise NearsightError(
            f"{path}: its output {name} {shape} has no batch dimension (expected [N, D]: one "
            "embedding per image)"
        )
    sizes = shape[1:]
    if all(isinstance(size, int) and size > 0 for size in sizes):
        _check_width(path, name, int(np.prod(sizes)))


def _check_width(path: Path, name: str, width: int) -> None:
    if not 1 <= width <= MAX_EMBEDDING_DIM:
        raise NearsightError(
            f"{path}: its output {name} has {width:,} values per image; an embedding has 1 to "
            f"{MAX_EMBEDDING_DIM:,} (--output names another output)"
        )


def _probe(session: Any, path: Path, input_name: str, output_name: str, size: int) -> int:
    """Run the graph on one blank image (and on two when its batch is free): the embedding
    width, checked; NearsightError for an output without its batch dimension."""
    fixed = fixed_batch(session, path)
    width: int | None = None
    for batch in (fixed,) if fixed else (1, 2):
        blank = np.zeros((batch, 3, size, size), np.float32)
        try:
            (result,) = session.run([output_name], {input_name: blank})
        except Exception as error:
            reason = " ".join(str(error).split())[:200]
            raise NearsightError(
                f"{path} does not run on [N, 3, {size}, {size}] images ({reason}): "
                "check --input-size"
            ) from None
        shape = list(np.shape(result))
        if len(shape) < 2 or shape[0] != batch:
            raise NearsightError(
                f"{path}: its output {output_name} is {shape} for a batch of {batch} image(s): "
                "it loses the batch dimension (expected [N, D]: one embedding per image)"
            )
        _check_width(path, output_name, int(np.prod(shape[1:])))
        if width is not None and int(np.prod(shape[1:])) != width:
            raise NearsightError(
                f"{path}: its output {output_name} changes width with the batch size"
            )
        width = int(np.prod(shape[1:]))
    assert width is not None  # the loop ran at least once
    return width


def foreign_spec(
    path: str | os.PathLike[str],
    *,
    image_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    resize: int | None = None,
    output: str | None = None,
) -> ModelSpec:
    """The spec of the ONNX model at ``path``: its image input, the ``output`` (default: its
    first) and the embedding width, found by running one blank image through it.
    ``image_size``: the square crop it takes (default: its input's, when the graph fixes
    one); ``mean`` and ``std``: the input normalisation it was trained with (default
    ImageNet's); ``resize``: the short side before the crop (default 256/224 of it)."""
    import onnxruntime as ort

    file = Path(path)
    if not file.is_file():
        raise NearsightError(f"model not found: {file}")
    if file.suffix.lower() != ".onnx":
        raise NearsightError(f"{file}: a model exported elsewhere must be a .onnx file")
    if image_size is not None and (
        isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1
    ):
        raise NearsightError(f"--input-size must be a positive whole number, got {image_size!r}")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = open_session(file, options, ["CPUExecutionProvider"])
    if session.get_modelmeta().custom_metadata_map.get("format") == MODEL_FORMAT:
        raise NearsightError(
            f"{file} is a nearsight model, which describes itself: leave out --input-size, "
            "--mean, --std, --resize and --output"
        )
    image_input = _image_input(session, file)
    channels = image_input.shape[1]
    if isinstance(channels, int) and channels != 3:
        raise NearsightError(
            f"{file}: its input {image_input.name} {list(image_input.shape)} is not [N, 3, H, W] "
            "(channels first, RGB)"
        )
    output_name = _output(session, file, output)
    height, width = image_input.shape[2:]
    if image_size is None:
        if not (isinstance(height, int) and height > 0 and height == width):
            raise NearsightError(
                f"{file} takes images of any size ({image_input.name} "
                f"{list(image_input.shape)}): give its --input-size"
            )
        image_size = height
    _check_declared_output(session, file, output_name)
    dim = _probe(session, file, image_input.name, output_name, image_size)
    return ModelSpec(
        arch="onnx",
        dim=dim,
        image_size=image_size,
        test_resize=int(resize or 0),
        input_name=image_input.name,
        output_name=output_name,
        mean=tuple(IMAGENET_MEAN if mean is None else mean),
        std=tuple(IMAGENET_STD if std is None else std),
    )


class ForeignOnnxEmbedder(OnnxEmbedder):
    """An :class:`OnnxEmbedder` for a model exported elsewhere, run as ``spec`` says."""

    def __init__(self, path: str | os.PathLike[str], spec: ModelSpec, **options: Any) -> None:
        if not spec.foreign:
            raise NearsightError("a foreign model's spec needs input_name, output_name, mean, std")
        self._given_spec = spec
        super().__init__(path, **options)

    def _read_model(self, session: Any) -> None:
        spec = self._given_spec
        image_input = _image_input(session, self.path)
        if image_input.name != spec.input_name:
            raise NearsightError(
                f"{self.path} takes {image_input.name!r}, not the recorded input "
                f"{spec.input_name!r}: is it the same model?"
            )
        _output(session, self.path, spec.output_name)
        _check_declared_output(session, self.path, spec.output_name)
        self.metadata = dict(session.get_modelmeta().custom_metadata_map)
        self.spec = spec
        self._transform = test_transform(self.image_size, self.resize, spec.interpolation)
        self._batch = fixed_batch(session, self.path)
        self._mean = np.asarray(spec.mean, np.float32).reshape(1, 3, 1, 1)
        self._std = np.asarray(spec.std, np.float32).reshape(1, 3, 1, 1)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        inputs = (batch - self._mean) / self._std
        step = self._batch or len(inputs)
        parts = []
        for start in range(0, len(inputs), step):
            piece = inputs[start : start + step]
            missing = step - len(piece)  # a graph with a fixed batch size: pad the last piece
            if missing:
                piece = np.concatenate([piece, np.zeros((missing, *piece.shape[1:]), np.float32)])
            (out,) = self.session.run([self.spec.output_name], {self.spec.input_name: piece})
            out = np.asarray(out, dtype=np.float32)
            if out.ndim < 2 or out.shape[0] != len(piece):
                raise NearsightError(
                    f"{self.path}: its output {self.spec.output_name} is {list(out.shape)} for "
                    f"a batch of {len(piece)} images (expected [N, D]): is it the same model?"
                )
            out = out.reshape(len(piece), -1)
            parts.append(out[: len(piece) - missing])
        vectors = np.concatenate(parts)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        # a zero vector stays zero (and _check_output names the problem)
        return vectors / np.where(norms > 0, norms, 1.0)
