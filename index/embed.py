"""Embed many image files in batches: workers decode, the model embeds, bad files are skipped.

Used by the trainer's evaluation and by ``nearsight index build``; both go through the same
decoding (:func:`index.images.load_image`) and the same test transform
(:func:`models.preprocess.test_transform`). An unreadable image never aborts the job: it is
skipped, and its path and reason are returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from nearsight.index.images import ImageLoadError, load_image
from nearsight.models.preprocess import test_transform
from nearsight.models.progress import progress


class ImagePathDataset(Dataset):
    """Test-transformed images by path; an unreadable one gives ``None`` and its error text."""

    def __init__(self, paths: Sequence[str | Path], image_size: int, resize: int | None = None):
        self.paths = [Path(p) for p in paths]
        self.transform = test_transform(image_size, resize)
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, str]:
        try:
            image = load_image(self.paths[index])
        except ImageLoadError as error:
            return index, None, str(error)
        return index, self.transform(image), ""


def _collate(batch: list[tuple[int, torch.Tensor | None, str]]):
    return batch


@dataclass
class EmbeddingResult:
    embeddings: np.ndarray  # [n_ok, D] float32, rows in input order of the readable images
    ok: np.ndarray  # [n] bool: which input paths were embedded
    errors: list[str] = field(default_factory=list)  # one line per skipped image


def embed_paths(
    embed_batch: Callable[[torch.Tensor], torch.Tensor | np.ndarray],
    paths: Sequence[str | Path],
    *,
    image_size: int,
    resize: int | None = None,
    batch_size: int = 64,
    workers: int = 0,
    desc: str = "embedding",
) -> EmbeddingResult:
    """Run ``embed_batch`` (images [B,3,H,W] in [0,1] -> [B,D]) over ``paths``."""
    dataset = ImagePathDataset(paths, image_size, resize)
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=_collate
    )
    ok = np.zeros(len(dataset), dtype=bool)
    errors: list[str] = []
    chunks: list[np.ndarray] = []
    total_batches = (len(dataset) + batch_size - 1) // batch_size
    for batch in progress(loader, total=total_batches, desc=desc, unit="batch"):
        good = [(i, x) for i, x, _ in batch if x is not None]
        errors.extend(err for _, x, err in batch if x is None)
        if not good:
            continue
        images = torch.stack([x for _, x in good])
        out = embed_batch(images)
        out = out.detach().float().cpu().numpy() if isinstance(out, torch.Tensor) else out
        chunks.append(np.asarray(out, dtype=np.float32))
        ok[[i for i, _ in good]] = True
    dim = chunks[0].shape[1] if chunks else 0
    embeddings = np.concatenate(chunks) if chunks else np.zeros((0, dim), np.float32)
    return EmbeddingResult(np.ascontiguousarray(embeddings), ok, errors)
