"""Embed many image files in batches: threads decode, the model embeds, bad files are skipped.

Used by the trainer's evaluation and by ``nearsight index build``/``add`` and ``search
--queries``; all go through the same decoding (:func:`nearsight.data.images.load_image`) and the
same test transform (:func:`nearsight.models.preprocess.test_transform`). Files nobody vetted
(``untrusted``, the default) are decoded in the decode box (:mod:`nearsight.data.decode_box`,
one worker per decoding thread): a file over its memory or time limit is skipped like an
unreadable one. An unreadable image never aborts the job: it is skipped, and its path and
reason are returned. No torch: indexing with an ONNX model must not
need it (decoding and resizing in Pillow release the GIL, so threads overlap them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.core.progress import progress
from nearsight.data.decode_box import fit_file, shared_box
from nearsight.data.images import ImageLoadError, load_image_sized
from nearsight.models.preprocess import fit_short_side, test_transform
from nearsight.models.spec import default_resize

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.models.embedder import Embedder


class ImagePaths:
    """Test-transformed images by path, with their loaded (width, height); an unreadable one
    gives ``None`` and its error text. ``box_workers``: decode in that many decode-box workers
    (0: in this process, for trusted files)."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        image_size: int,
        resize: int | None = None,
        interpolation: str = "bilinear",
        box_workers: int = 0,
    ):
        self.paths = [Path(p) for p in paths]
        self.transform = test_transform(image_size, resize, interpolation)
        self.image_size = image_size
        self.min_side = resize or default_resize(image_size)  # JPEG draft decoding
        self.interpolation = interpolation
        self.box_workers = box_workers

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str, tuple[int, int]]:
        try:
            if self.box_workers:
                fitted = fit_file(
                    self.paths[index], self.min_side, self.interpolation, self.box_workers
                )
                image, size = fitted.image, fitted.loaded_size
            else:
                image, size = load_image_sized(self.paths[index], None, self.min_side)
                image = fit_short_side(image, self.min_side, self.interpolation)
        except ImageLoadError as error:
            return index, None, str(error), (0, 0)
        return index, self.transform(image), "", size


@dataclass
class EmbeddingResult:
    embeddings: np.ndarray  # [n_ok, D] float32, rows in input order of the readable images
    ok: np.ndarray  # [n] bool: which input paths were embedded
    errors: list[str] = field(default_factory=list)  # one line per skipped image
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (width, height) of each ok


def _batches(
    images: ImagePaths, batch_size: int, workers: int
) -> Iterator[list[tuple[int, np.ndarray | None, str, tuple[int, int]]]]:
    """Batches in input order; with ``workers`` threads, up to two batches are decoded ahead."""
    if workers <= 0:
        for start in range(0, len(images), batch_size):
            yield [images[i] for i in range(start, min(start + batch_size, len(images)))]
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ahead = 2 * batch_size
        pending: deque[Future] = deque(
            pool.submit(images.__getitem__, i) for i in range(min(ahead, len(images)))
        )
        following = len(pending)
        batch: list[tuple[int, np.ndarray | None, str, tuple[int, int]]] = []
        while pending:
            batch.append(pending.popleft().result())
            if following < len(images):
                pending.append(pool.submit(images.__getitem__, following))
                following += 1
            if len(batch) == batch_size or not pending:
                yield batch
                batch = []


def embed_paths(
    embed_batch: Callable[[np.ndarray], Any],
    paths: Sequence[str | Path],
    *,
    image_size: int,
    resize: int | None = None,
    interpolation: str = "bilinear",
    batch_size: int = 64,
    workers: int = 0,
    desc: str = "embedding",
    untrusted: bool = True,
) -> EmbeddingResult:
    """Run ``embed_batch`` (images float32 [B,3,H,W] in [0,1] -> [B,D] array or tensor) over
    ``paths``. ``workers``: decoding threads (0: decode in this thread). ``untrusted``: decode
    in the decode box (unless images are trusted process-wide, decode_box.set_trusted)."""
    box_workers = max(1, workers) if untrusted and shared_box(max(1, workers)) else 0
    images = ImagePaths(paths, image_size, resize, interpolation, box_workers)
    ok = np.zeros(len(images), dtype=bool)
    errors: list[str] = []
    chunks: list[np.ndarray] = []
    sizes: list[tuple[int, int]] = []
    total_batches = (len(images) + batch_size - 1) // batch_size
    batches = _batches(images, batch_size, workers)
    for batch in progress(batches, total=total_batches, desc=desc, unit="batch"):
        good = [(i, x) for i, x, _, _ in batch if x is not None]
        errors.extend(err for _, x, err, _ in batch if x is None)
        sizes.extend(size for _, x, _, size in batch if x is not None)
        if not good:
            continue
        out = embed_batch(np.stack([x for _, x in good]))
        if hasattr(out, "detach"):  # a torch tensor
            out = out.detach().float().cpu().numpy()
        chunks.append(np.asarray(out, dtype=np.float32))
        ok[[i for i, _ in good]] = True
    dim = chunks[0].shape[1] if chunks else 0
    embeddings = np.concatenate(chunks) if chunks else np.zeros((0, dim), np.float32)
    return EmbeddingResult(np.ascontiguousarray(embeddings), ok, errors, sizes)


def check_batching(batch_size: int, workers: int) -> None:
    """``embed_files``' batch size (at least 1) and decoding workers (0 or more), checked before
    a model loads (one-line errors naming the command's flags)."""
    if batch_size < 1:
        raise NearsightError(f"--batch-size must be at least 1, got {batch_size}")
    if workers < 0:
        raise NearsightError(f"--workers must be 0 or more, got {workers}")


def embed_files(
    embedder: Embedder,
    paths: Sequence[str | Path],
    *,
    batch_size: int = 64,
    workers: int = 0,
    desc: str = "embedding",
    untrusted: bool = True,
) -> EmbeddingResult:
    """``embed_paths`` with a loaded embedder (``nearsight.models.embedder``), at the image size and
    resize its model records."""
    return embed_paths(
        embedder.embed,
        paths,
        image_size=embedder.image_size,
        resize=embedder.resize,
        interpolation=embedder.spec.interpolation,
        batch_size=batch_size,
        workers=workers,
        desc=desc,
        untrusted=untrusted,
    )
