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


def default_resize(image_size: int) -> int:
    """The papers' ratio: resize to 256 then crop 224."""
    return round(image_size * 256 / 224)


def test_transform(
    image_size: int, resize: int | None = None
) -> Callable[[Image.Image], torch.Tensor]:
    """PIL RGB image -> float32 tensor [3, image_size, image_size] in [0, 1]."""
    resize = resize or default_resize(image_size)

    def transform(image: Image.Image) -> torch.Tensor:
        image = TF.resize(image, resize, interpolation=InterpolationMode.BILINEAR, antialias=True)
        image = TF.center_crop(image, [image_size, image_size])
        return TF.pil_to_tensor(image).float().div_(255.0)

    return transform
