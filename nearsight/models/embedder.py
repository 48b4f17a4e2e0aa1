"""Embedder runtimes: one interface over an exported ONNX model and a training checkpoint.

An :class:`Embedder` turns images into L2-normalised embeddings. Two implementations:

- :class:`OnnxEmbedder`: a ``model.onnx`` written by ``nearsight export``, run by onnxruntime
  (CUDA when a GPU really works here, the CPU otherwise: nearsight/models/onnx_session.py);
- :class:`TorchEmbedder`: a ``best.pt``/``last.pt`` checkpoint, run by torch.

Both take float RGB in [0, 1] ([N, 3, image_size, image_size]; ImageNet normalisation is inside
the model) and both preprocess PIL images with :func:`nearsight.models.preprocess.test_transform`, so a
gallery built with one and a query embedded with the other see the same pixels.

Which hash identifies a model (``model_sha256``, recorded by galleries): the sha256 of the FILE
that was loaded, the ``.onnx`` file itself for ONNX. The checkpoint's sha256 (kept in the
metadata as ``checkpoint_sha256``) is not enough: the fp32 and int8 models exported from one
checkpoint share it but give different vectors, and a gallery must be searched with the model
that built it. So a gallery built from model.onnx is searchable with that same model.onnx (and
with nothing else, not even the checkpoint it came from, whose vectors differ by up to 1e-4).

Metadata: every nearsight model carries the string map :data:`METADATA_KEYS` (ONNX
``metadata_props``; for a checkpoint it is computed from the checkpoint), and a file without the
``format`` tag is refused: "PATH is not a nearsight model: ...".
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from PIL import Image

from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.core.threads import physical_cores, worker_threads  # noqa: F401  (re-exported)
from nearsight.models.onnx_session import default_providers, open_session
from nearsight.models.preprocess import test_transform
from nearsight.models.spec import SPEC_KEY, ModelSpec, spec_from_checkpoint, spec_from_onnx_metadata

if TYPE_CHECKING:  # torch only for checkpoints: serving an ONNX model never imports it
    import torch

MODEL_FORMAT = "nearsight-embedding"
MODEL_FORMAT_VERSION = 1
INPUT_NAME = "images"
OUTPUT_NAME = "embeddings"
# what every nearsight model says about itself (all values are strings, as in ONNX metadata)
METADATA_KEYS = (
    "format",  # MODEL_FORMAT
    "format_version",
    SPEC_KEY,  # ModelSpec as JSON: arch, dim, image size, test resize, pooling, ...
    "loss",  # the training loss ("" when the checkpoint does not say)
    "dataset",  # the training dataset ("" when the checkpoint does not say)
    "training_step",
    "training_metrics",  # JSON of the evaluation that selected the checkpoint
    "checkpoint_sha256",
    "nearsight_version",
    "precision",  # fp32 | int8
    "opset",  # ONNX only
)


def nearsight_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nearsight")
    except PackageNotFoundError:
        return "unknown"


def checkpoint_metadata(payload: Mapping[str, Any], checkpoint_sha256: str) -> dict[str, str]:
    """The metadata of the model in a loaded checkpoint (``nearsight.models.checkpoint.load_checkpoint``):
    its :class:`ModelSpec` (legacy checkpoints: from their model config and training config)
    and where it came from."""
    training: Mapping[str, Any] = (
        payload["training"] if isinstance(payload.get("training"), dict) else {}
    )
    metrics = training.get("metrics") or {}
    return {
        "format": MODEL_FORMAT,
        "format_version": str(MODEL_FORMAT_VERSION),
        SPEC_KEY: spec_from_checkpoint(payload).to_json(),
        "loss": str(training.get("loss") or ""),
        "dataset": str(training.get("dataset") or ""),
        "training_step": str(training.get("step", "")),
        "training_metrics": json.dumps(metrics, sort_keys=True, default=str),
        "checkpoint_sha256": checkpoint_sha256,
        "nearsight_version": nearsight_version(),
        "precision": "fp32",
    }


@runtime_checkable
class Embedder(Protocol):
    """images -> embeddings [N, dim] float32, unit L2 norm."""

    @property
    def path(self) -> Path: ...

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def dim(self) -> int: ...

    @property
    def image_size(self) -> int: ...

    @property
    def resize(self) -> int: ...

    @property
    def metadata(self) -> dict[str, str]: ...

    @property
    def model_sha256(self) -> str:
        """sha256 of the model file that was loaded (what galleries record)."""
        ...

    def embed(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        """[N, 3, image_size, image_size] float RGB in [0, 1] -> [N, dim] float32."""
        ...

    def embed_images(self, images: Sequence[Image.Image], batch_size: int = 32) -> np.ndarray:
        """RGB PIL images -> [N, dim] float32, through nearsight.models.preprocess.test_transform."""
        ...


class _EmbedderBase:
    """What both runtimes share: metadata parsing, input checks, PIL preprocessing."""

    path: Path
    metadata: dict[str, str]

    def _init_metadata(self, metadata: Mapping[str, str]) -> None:
        self.metadata = dict(metadata)
        try:
            self.spec = spec_from_onnx_metadata(self.metadata)
        except NearsightError as error:
            raise NearsightError(
                f"{self.path} is not a nearsight model: bad metadata ({error})"
            ) from None
        self._transform = test_transform(self.image_size, self.resize, self.spec.interpolation)

    @property
    def dim(self) -> int:
        """The width of the embeddings this model serves."""
        return self.spec.output_dim

    @property
    def image_size(self) -> int:
        return self.spec.image_size

    @property
    def resize(self) -> int:
        """The short side the test transform resizes to before cropping."""
        return self.spec.test_resize

    @property
    def interpolation(self) -> str:
        """How the test transform resizes: bilinear | bicubic."""
        return self.spec.interpolation

    @functools.cached_property
    def model_sha256(self) -> str:
        return file_sha256(self.path)

    def _check_batch(self, images: torch.Tensor | np.ndarray) -> np.ndarray | torch.Tensor:
        shape = tuple(images.shape)
        expected = (3, self.image_size, self.image_size)
        if len(shape) != 4 or shape[1:] != expected:
            raise NearsightError(
                f"images must have shape [N, {expected[0]}, {expected[1]}, {expected[2]}] "
                f"for {self.path.name}, got {list(shape)}"
            )
        return images

    def embed(self, images: torch.Tensor | np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _check_output(self, embeddings: np.ndarray, count: int) -> np.ndarray:
        """The model's output must be [N, dim] finite unit vectors: a checkpoint whose training
        diverged gives NaN, a foreign graph tagged as ours anything at all; either would
        otherwise fail far from here (a gallery write, a FAISS search)."""
        if embeddings.shape != (count, self.dim):
            problem = f"shape {list(embeddings.shape)}, not [{count}, {self.dim}]"
        elif not np.isfinite(embeddings).all():
            problem = "NaN or infinite values (broken weights: did its training diverge?)"
        elif count and np.abs(np.linalg.norm(embeddings, axis=1) - 1.0).max() > 1e-3:
            problem = "vectors that are not L2-normalised"
        else:
            return embeddings
        raise NearsightError(
            f"{self.path} is not a usable nearsight model: its output has {problem}"
        )

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One decoded image as the model's input [3, S, S] in [0, 1] (what embed_images does
        to each image; the server's micro-batcher calls it per request, then embeds a batch)."""
        # convert() copies even an RGB image: for a 64 MP upload that is 256 MB more
        return self._transform(image if image.mode == "RGB" else image.convert("RGB"))

    def embed_images(self, images: Sequence[Image.Image], batch_size: int = 32) -> np.ndarray:
        if batch_size <= 0:
            raise NearsightError(f"batch size must be positive, got {batch_size}")
        chunks = [np.zeros((0, self.dim), np.float32)]
        for start in range(0, len(images), batch_size):
            batch = np.stack(
                [self.preprocess(image) for image in images[start : start + batch_size]]
            )
            chunks.append(self.embed(batch))
        return np.concatenate(chunks)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({str(self.path)!r}, dim={self.dim}, image_size={self.image_size})"


class OnnxEmbedder(_EmbedderBase):
    """A ``nearsight export`` model run by onnxruntime.

    ``providers``: onnxruntime provider names (default: CUDA when a GPU really works, else CPU;
    :attr:`providers` says what the session actually uses). ``threads``: intra-op threads for
    the CPU provider (default: the physical cores). ``optimization``: onnxruntime's graph
    optimisation level, ``all`` (default: the fastest per image, for servers and batches) or
    ``extended`` (no layout transforms: the session loads in about half the time and memory,
    for a one-query process; docs/decisions.md)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        optimization: str = "all",
    ) -> None:
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise NearsightError(f"model not found: {self.path}")
        if threads is not None and threads <= 0:
            raise NearsightError(f"threads must be positive, got {threads}")
        options = ort.SessionOptions()
        levels = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        }
        if optimization not in levels:
            raise NearsightError(f"optimization must be all or extended, got {optimization!r}")
        options.graph_optimization_level = levels[optimization]
        options.intra_op_num_threads = worker_threads(threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only: no per-node placement warnings
        wanted = list(providers) if providers is not None else default_providers("auto")
        session = open_session(self.path, options, wanted)
        self.session = session
        self.providers: list[str] = session.get_providers()
        self._read_model(session)

    def _read_model(self, session: Any) -> None:
        """Check the graph is a nearsight export and read its spec from its metadata."""
        metadata = dict(session.get_modelmeta().custom_metadata_map)
        if metadata.get("format") != MODEL_FORMAT:
            raise NearsightError(
                f"{self.path} is not a nearsight model: its ONNX metadata has no "
                f"format={MODEL_FORMAT} (write one with `nearsight export`; for a model "
                "exported elsewhere, give --input-size, --mean and --std)"
            )
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if [i.name for i in inputs] != [INPUT_NAME] or OUTPUT_NAME not in [o.name for o in outputs]:
            raise NearsightError(
                f"{self.path} is not a nearsight model: expected input '{INPUT_NAME}' and "
                f"output '{OUTPUT_NAME}'"
            )
        self._init_metadata(metadata)

    @property
    def device(self) -> str:
        return "cuda" if self.providers and self.providers[0] == "CUDAExecutionProvider" else "cpu"

    def embed(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        self._check_batch(images)
        if hasattr(images, "detach"):  # a torch tensor (the trainer's batches)
            images = images.detach().cpu().numpy()
        batch = np.ascontiguousarray(images, dtype=np.float32)
        if batch.shape[0] == 0:
            return np.zeros((0, self.dim), np.float32)
        return self._check_output(self._run(batch), len(batch))

    def _run(self, batch: np.ndarray) -> np.ndarray:
        (embeddings,) = self.session.run([OUTPUT_NAME], {INPUT_NAME: batch})
        return np.asarray(embeddings, dtype=np.float32)
