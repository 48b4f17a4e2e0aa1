"""The Pillow + numpy test transform (nearsight/models/preprocess.py) against torchvision's transforms, the
reference it replaces on the serving path: equal within 1e-6 for every shape it meets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from nearsight.models.preprocess import MAX_ASPECT_RATIO, default_resize
from nearsight.models.preprocess import test_transform as make_test_transform


def torchvision_transform(image: Image.Image, image_size: int, resize: int) -> torch.Tensor:
    """The torch path as it was: centre cut of extreme aspect ratios, Resize, CenterCrop,
    PILToTensor / 255."""
    width, height = image.size
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        keep = MAX_ASPECT_RATIO * min(width, height)
        image = TF.center_crop(image, [height, keep] if width > height else [keep, width])
    image = TF.resize(image, resize, interpolation=InterpolationMode.BILINEAR, antialias=True)
    image = TF.center_crop(image, [image_size, image_size])
    return TF.pil_to_tensor(image).float().div_(255.0)


def noise_image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


@pytest.mark.parametrize(
    ("width", "height", "image_size", "resize"),
    [
        (300, 200, 224, None),  # landscape, the default 256 -> 224
        (200, 300, 224, None),  # portrait
        (257, 256, 224, 256),  # one pixel off square (rounding of the long side)
        (256, 256, 224, 256),  # already the resize: no resampling
        (37, 53, 32, None),  # tiny, odd sizes and odd crop offsets
        (64, 48, 32, 36),
        (20, 15, 32, 24),  # upsampling
        (40, 40, 32, 30),  # crop larger than the resized image: zero padding (even)
        (41, 40, 33, 30),  # ... and odd padding on one axis
        (2000, 30, 32, None),  # past MAX_ASPECT_RATIO: the long side is cut first
        (30, 2000, 32, None),
        (1, 5000, 16, None),
    ],
)
def test_numpy_transform_matches_torchvision(width, height, image_size, resize):
    image = noise_image(width, height, seed=width * 7 + height)
    ours = make_test_transform(image_size, resize)(image)
    reference = torchvision_transform(image, image_size, resize or default_resize(image_size))
    assert ours.dtype == np.float32 and ours.shape == (3, image_size, image_size)
    np.testing.assert_allclose(ours, reference.numpy(), rtol=0, atol=1e-6)


def test_grey_and_alpha_images_become_rgb():
    grey = Image.fromarray(np.arange(64 * 48, dtype=np.uint32).reshape(48, 64).astype(np.uint8))
    ours = make_test_transform(32)(grey)
    reference = torchvision_transform(grey.convert("RGB"), 32, default_resize(32))
    np.testing.assert_allclose(ours, reference.numpy(), rtol=0, atol=1e-6)
    assert np.array_equal(ours[0], ours[1]) and np.array_equal(ours[1], ours[2])
