"""The torch runtime of the :class:`~nearsight.models.embedder.Embedder` interface: a training
checkpoint (``best.pt``) run by torch (the ``[train]`` extra). torch is imported when one is
created, so importing this module costs nothing."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.models.embedder import _EmbedderBase, checkpoint_metadata
from nearsight.models.hardware import resolve_fast_math

if TYPE_CHECKING:
    import torch


class TorchEmbedder(_EmbedderBase):
    """A training checkpoint (``best.pt``) run by torch; ``device``: auto | cpu | cuda. bf16
    autocast and channels_last follow the hardware as in training (``amp``/``channels_last``
    ``"auto"``), or are set by the caller."""

    def __init__(
        self,
        checkpoint_path: str | os.PathLike[str],
        device: str = "auto",
        *,
        amp: bool | str = "auto",
        channels_last: bool | str = "auto",
    ) -> None:
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
        # the same choice as training (nearsight/models/hardware.py); amp/channels_last: auto,
        # True or False
        self.amp, self.channels_last, self.precision_note = resolve_fast_math(
            amp, channels_last, cuda=device == "cuda"
        )
        if self.channels_last:
            self.net.to(memory_format=torch.channels_last)
        self._init_metadata(checkpoint_metadata(payload, self.model_sha256))

    def embed(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        import torch

        self._check_batch(images)
        batch = torch.as_tensor(images, dtype=torch.float32)
        if batch.shape[0] == 0:
            return np.zeros((0, self.dim), np.float32)
        batch = batch.to(self.device)
        if self.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        autocast = (
            torch.autocast(self.device, dtype=torch.bfloat16)
            if self.amp
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            out = self.net(batch)
        out = out.float()
        if self.amp:  # bf16 rounding leaves the norm off 1 by ~1e-3: renormalise in float32
            out = torch.nn.functional.normalize(out, dim=1)
        return self._check_output(out.cpu().numpy(), len(batch))
