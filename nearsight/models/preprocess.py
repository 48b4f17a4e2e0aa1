"""The one test-time preprocessing: resize the short side, centre-crop, scale to [0, 1].

Written on Pillow and numpy, so that serving an ONNX model needs no torch. It follows
torchvision's ``Resize(resize, BILINEAR, antialias=True)`` + ``CenterCrop(image_size)`` +
``PILToTensor() / 255`` on PIL images step by step (the same Pillow resize, the same crop
offsets, zero padding when the crop is larger than the image); tests/models/test_preprocess.py checks
it against torchvision. The resize is bilinear (the ResNets') or bicubic (most timm trunks' pretrained
configs), as the model's spec says. Training's evaluation, the torch and the onnxruntime embedders and the
export's calibration all call :func:`test_transform`, so they see the same pixels. ImageNet
mean/std normalisation is not here: it lives inside the model (and so inside the ONNX graph),
which takes RGB in [0, 1]. A foreign model (models.foreign) gets it from its embedder instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image

from nearsight.models.spec import default_resize

# torchvision's ImageNet statistics: inside nearsight's models; a foreign model's default
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Past this ratio of long to short side, the long side is cut before resizing (see below).
MAX_ASPECT_RATIO = 16


def _crop_offset(size: int, crop: int) -> int:
    """torchvision's centre-crop offset; negative where it pads (pad before = (crop-size)//2)."""
    if crop > size:
        return -((crop - size) // 2)
    return int(round((size - crop) / 2.0))


def center_crop(image: Image.Image, height: int, width: int) -> Image.Image:
    """The centre ``height`` x ``width`` of ``image``, zero-padded where it is smaller."""
    left = _crop_offset(image.width, width)
    top = _crop_offset(image.height, height)
    if (left, top, width, height) == (0, 0, image.width, image.height):
        return image
    return image.crop((left, top, left + width, top + height))  # outside the image: zeros


RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def resize_short_side(
    image: Image.Image, short: int, interpolation: str = "bilinear"
) -> Image.Image:
    """Resize (Pillow's, antialiased; bilinear or bicubic) so that the short side is ``short``
    pixels."""
    width, height = image.size
    if width <= height:
        size = (short, int(short * height / width))
    else:
        size = (int(short * width / height), short)
    if size == image.size:
        return image
    return image.resize(size, RESAMPLING[interpolation])


def fit_short_side(image: Image.Image, short: int, interpolation: str = "bilinear") -> Image.Image:
    """The test transform's first step: the long side cut to at most
    :data:`MAX_ASPECT_RATIO` short sides (centred), then the short side resized to ``short``.
    Its result is a fixed point (fitting it again returns it unchanged), so pixels fitted
    elsewhere (the decode box) go through :func:`test_transform` to the same array."""
    width, height = image.size
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        # Resizing the short side scales the long side too: a 1 x 100000 PNG (a few hundred
        # bytes) would become 256 x 25.6M pixels (20 GB) before the crop keeps 224 x 224.
        # Only the centre can reach the crop: cut the long side to 16 short sides first.
        keep = MAX_ASPECT_RATIO * min(width, height)
        image = center_crop(image, *((height, keep) if width > height else (keep, width)))
    return resize_short_side(image, short, interpolation)


def to_array(image: Image.Image) -> np.ndarray:
    """RGB PIL image -> float32 [3, H, W] in [0, 1]."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    pixels = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)
    return np.divide(pixels, np.float32(255.0), dtype=np.float32)


def test_transform(
    image_size: int, resize: int | None = None, interpolation: str = "bilinear"
) -> Callable[[Image.Image], np.ndarray]:
    """PIL RGB image -> float32 array [3, image_size, image_size] in [0, 1]
    (``torch.from_numpy`` makes it a tensor without a copy); ``interpolation``: bilinear |
    bicubic (the model spec's)."""
    resize = resize or default_resize(image_size)
    if interpolation not in RESAMPLING:
        raise ValueError(f"interpolation must be one of {', '.join(RESAMPLING)}")

    def transform(image: Image.Image) -> np.ndarray:
        image = fit_short_side(image, resize, interpolation)
        image = center_crop(image, image_size, image_size)
        return to_array(image)

    return transform
