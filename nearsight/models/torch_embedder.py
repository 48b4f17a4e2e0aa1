"""The torch runtime of the :class:`~nearsight.models.embedder.Embedder` interface: a training
checkpoint (``best.pt``) run by torch (the ``[train]`` extra). torch is imported when one is
created, so importing this module costs nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.models.embedder import _EmbedderBase, checkpoint_metadata

if TYPE_CHECKING:
    import torch


class TorchEmbedder(_EmbedderBase):
    """A training checkpoint (``best.pt``) run by torch; ``device``: auto | cpu | cuda."""

    def __init__(self, checkpoint_path: str | os.PathLike[str], device: str = "auto") -> None:
        import torch

        from nearsight.models.checkpoint import load_checkpoint, load_embedding_net

        self.path = Path(checkpoint_path)
        if device not in ("auto", "cpu", "cuda"):
            raise NearsightError(f"device must be auto, cpu or cuda, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise NearsightError("--device cuda: no working CUDA GPU for torch here")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        payload = load_checkpoint(self.path)  # one-line errors for missing/foreign files
        self.net = load_embedding_net(self.path, map_location=device)
        self._init_metadata(checkpoint_metadata(payload, self.model_sha256))

    def embed(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        import torch

        self._check_batch(images)
        batch = torch.as_tensor(images, dtype=torch.float32)
        if batch.shape[0] == 0:
            return np.zeros((0, self.dim), np.float32)
        with torch.inference_mode():
            out = self.net(batch.to(self.device))
        return self._check_output(out.float().cpu().numpy(), len(batch))
