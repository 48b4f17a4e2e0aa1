"""Evaluation during training: embed a held-out split, compute Recall@k / NMI / MAP@R.

With ``data.cache_images`` the split's test-time tensors are made once and reused at every
evaluation (a small dataset evaluated often would otherwise decode every image each time).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from nearsight.data.datasets import DatasetSplit
from nearsight.data.embed import embed_paths
from nearsight.data.images import ImageLoadError, load_image
from nearsight.data.metrics.retrieval import evaluate
from nearsight.models.preprocess import test_transform
from nearsight.models.spec import default_resize
from nearsight.training.config import TrainConfig

log = logging.getLogger(__name__)


class EvalSplit:
    """One split to evaluate on (the test classes, or the validation hold-out)."""

    def __init__(self, split: DatasetSplit, config: TrainConfig, interpolation: str = "bilinear"):
        self.split = split
        self.config = config
        self.interpolation = interpolation  # the model spec's test-time resize
        self._tensors: torch.Tensor | None = None
        self._ok: np.ndarray | None = None
        if config.data.cache_images:
            self._load_tensors()

    def _load_tensors(self) -> None:
        size, resize = self.config.data.image_size, self.config.data.resize
        transform = test_transform(size, resize, self.interpolation)
        min_side = resize or default_resize(size)  # JPEG draft decoding, as galleries do
        tensors, ok = [], np.zeros(len(self.split), dtype=bool)
        for i, sample in enumerate(self.split.samples):
            try:
                tensors.append(torch.from_numpy(transform(load_image(sample.path, min_side))))
                ok[i] = True
            except ImageLoadError as error:
                log.warning("skipped in evaluation: %s", error)
        self._tensors = torch.stack(tensors) if tensors else torch.zeros(0, 3, 1, 1)
        self._ok = ok

    def embed(
        self, embed_batch: Callable[[torch.Tensor | np.ndarray], torch.Tensor]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings of the readable images, their mask over the split's samples)."""
        data = self.config.data
        if self._tensors is not None:
            assert self._ok is not None, "set with self._tensors (_load_tensors)"
            chunks = [
                embed_batch(self._tensors[i : i + data.eval_batch_size]).cpu().numpy()
                for i in range(0, len(self._tensors), data.eval_batch_size)
            ]
            return np.concatenate(chunks).astype(np.float32), self._ok
        result = embed_paths(
            embed_batch,
            [s.path for s in self.split.samples],
            image_size=data.image_size,
            resize=data.resize,
            interpolation=self.interpolation,
            batch_size=data.eval_batch_size,
            workers=data.workers,
            desc=f"evaluate {self.split.split}",
            untrusted=False,  # the operator's own dataset: decoded in process
        )
        for error in result.errors:
            log.warning("skipped in evaluation: %s", error)
        return result.embeddings, result.ok

    @torch.no_grad()
    def evaluate(
        self, model: torch.nn.Module, device: torch.device, autocast=None
    ) -> dict[str, Any]:
        """The retrieval metrics of ``model`` on this split (leave-one-out)."""
        model.eval()
        context = autocast or contextlib.nullcontext

        def embed_batch(images: torch.Tensor | np.ndarray) -> torch.Tensor:
            with context():
                return model(torch.as_tensor(images).to(device)).float()

        embeddings, ok = self.embed(embed_batch)
        labels = np.asarray(self.split.labels)[ok]
        return evaluate(
            embeddings, labels, ks=tuple(self.config.ks), nmi_average=self.config.nmi_average
        )
