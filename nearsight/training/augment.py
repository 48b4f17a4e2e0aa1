"""The papers' training augmentation, decoding only the pixels each crop needs.

Inception-style random resized crop (Szegedy et al., "Going deeper with convolutions", 2015,
as torchvision's ``RandomResizedCrop`` samples it: area ``crop_scale``, aspect ratio 3/4 to 4/3)
and a horizontal flip. The crop is drawn from the image's size before its pixels are decoded,
so a JPEG whose crop still has ``image_size`` pixels across at 1/2, 1/4 or 1/8 scale is decoded
at that scale (libjpeg's DCT scaling). The crop is resized by torch's antialiased bilinear
(or bicubic: the model spec's ``interpolation``, most timm trunks') kernel on uint8 pixels, as
torchvision's transforms do on a uint8 tensor; the random draws are
``RandomResizedCrop``'s and ``RandomHorizontalFlip``'s, in their order. Output: uint8
``[3, S, S]``; the training step scales it to [0, 1] on its device (a quarter of the bytes
through the DataLoader's queues).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.nn import functional as F
from torchvision.transforms import RandomResizedCrop

from nearsight.data.images import MinSide

RATIO = (3 / 4, 4 / 3)  # torchvision's default aspect ratios


class RandomCropDecode:
    """``transform(load)``: ``load(min_side)`` decodes the image as ``[H, W, 3]`` uint8
    (:func:`nearsight.data.images.load_image_pixels` with the path bound); returns the
    augmented ``[3, S, S]`` uint8 tensor."""

    def __init__(
        self,
        image_size: int,
        crop_scale: Sequence[float],
        flip: bool,
        interpolation: str = "bilinear",
    ):
        self.image_size = int(image_size)
        self.crop_scale = [float(crop_scale[0]), float(crop_scale[1])]
        self.flip = flip
        if interpolation not in ("bilinear", "bicubic"):
            raise ValueError(f"interpolation must be bilinear or bicubic, got {interpolation!r}")
        self.interpolation = interpolation

    def crop(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of a crop of a ``width`` x ``height`` image, drawn with
        torch's generator exactly as ``RandomResizedCrop`` draws it."""
        shape_only = torch.empty(1, 1, 1).expand(3, height, width)  # no pixels are allocated
        return RandomResizedCrop.get_params(shape_only, self.crop_scale, list(RATIO))

    def __call__(self, load: Callable[[MinSide], np.ndarray]) -> torch.Tensor:
        drawn: dict[str, tuple[int, ...]] = {}

        def min_side(width: int, height: int) -> int:
            # the short side the image must keep so that this crop keeps image_size pixels
            drawn["size"], drawn["crop"] = (width, height), self.crop(width, height)
            _, _, crop_height, crop_width = drawn["crop"]
            return math.ceil(min(width, height) * self.image_size / min(crop_height, crop_width))

        pixels = load(min_side)
        height, width = pixels.shape[:2]
        if "crop" not in drawn:  # not a JPEG (no draft), or decoded before: crop what is here
            drawn["size"], drawn["crop"] = (width, height), self.crop(width, height)
        (full_width, full_height), (top, left, crop_height, crop_width) = drawn.values()
        # the crop in the decoded pixels (a draft has 1/2, 1/4 or 1/8 of each side)
        x_scale, y_scale = width / full_width, height / full_height
        x0, x1 = _span(left, crop_width, x_scale, width)
        y0, y1 = _span(top, crop_height, y_scale, height)
        # [1, 3, h, w] with channels last in memory: torch's fast uint8 resize takes it as is
        region = torch.from_numpy(pixels).permute(2, 0, 1)[None, :, y0:y1, x0:x1]
        side = self.image_size
        out = F.interpolate(region, size=(side, side), mode=self.interpolation, antialias=True)[0]
        if self.flip and torch.rand(1) < 0.5:
            out = out.flip(-1)
        return out.contiguous()


def _span(start: int, length: int, scale: float, limit: int) -> tuple[int, int]:
    """A crop's [start, end) on one axis of the decoded pixels: at least one pixel, inside."""
    begin = min(int(round(start * scale)), limit - 1)
    return begin, max(begin + 1, min(limit, int(round((start + length) * scale))))
