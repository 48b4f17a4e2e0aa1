"""The one test-time preprocessing: resize the short side, centre-crop, scale to [0, 1].

Training's evaluation, the torch Embedder and the onnxruntime Embedder all call
:func:`test_transform`, so a gallery built with ONNX and an evaluation in the trainer see the
same pixels. ImageNet mean/std normalisation is not here: it lives inside the model (and so
inside the ONNX graph), which takes RGB in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

# Past this ratio of long to short side, the long side is cut before resizing (see below).
MAX_ASPECT_RATIO = 16


def default_resize(image_size: int) -> int:
    """The papers' ratio: resize to 256 then crop 224."""
    return round(image_size * 256 / 224)


def test_transform(
    image_size: int, resize: int | None = None
) -> Callable[[Image.Image], torch.Tensor]:
    """PIL RGB image -> float32 tensor [3, image_size, image_size] in [0, 1]."""
    resize = resize or default_resize(image_size)

    def transform(image: Image.Image) -> torch.Tensor:
        width, height = image.size
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            # Resizing the short side scales the long side too: a 1 x 100000 PNG (a few hundred
            # bytes) would become 256 x 25.6M pixels (20 GB) before the crop keeps 224 x 224.
            # Only the centre can reach the crop: cut the long side to 16 short sides first.
            keep = MAX_ASPECT_RATIO * min(width, height)
            image = TF.center_crop(image, [height, keep] if width > height else [keep, width])
        image = TF.resize(image, resize, interpolation=InterpolationMode.BILINEAR, antialias=True)
        image = TF.center_crop(image, [image_size, image_size])
        return TF.pil_to_tensor(image).float().div_(255.0)

    return transform
