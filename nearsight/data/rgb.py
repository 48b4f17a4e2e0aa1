"""Decoded Pillow images to 8-bit RGB, within a memory budget known before decoding.

What an image costs is not its pixel count: Pillow stores 1 byte per pixel for ``L``/``P``, 2
for 16-bit, 4 for ``RGB`` (as RGBX) and 32-bit/float, the conversion to RGB adds its own
buffers, and a progressive JPEG's decoder holds every DCT coefficient of the full-size image
(2 bytes per pixel and channel) whatever scale it outputs. Converting a whole 16-bit image
through float64 arrays took ~16 bytes per pixel (a 64 MP PNG of 124 KB cost 2.1 GB). Here the
high-bit and transparent modes are converted band by band and the decoded buffer is released
as soon as the conversion no longer needs it, so that at most the decoded buffer, the RGB
result and one band are alive, or the result and its copy turned upright:
:func:`decoded_bytes` is that peak, and nearsight.data.images refuses an image whose
estimate passes its budget before decoding it.

The conversions (pixel for pixel what they were when done on the whole image):

- grayscale, palette, CMYK and the like: Pillow's ``convert("RGB")``;
- 16-bit/32-bit/float: scaled to 8 bits (:func:`_high_bit_scale`; Pillow's own convert clips
  them, turning most of the image white);
- transparent pixels composited on white (dropping the alpha channel would show whatever
  colour the invisible pixels happen to hold, usually black).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

_WHITE = (255, 255, 255)
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_HIGH_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N", "I", "F"}
_STORED_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}
BAND_BYTES = 4 << 20  # one band of rows of the source, at most (a few MB)
MIN_PEAK_BYTES = 8  # room for the RGB result (4) and a rotated copy of it (4)
# Bytes a pixel a format's decoder holds besides Pillow's image: Pillow decodes WebP (lossy or
# lossless) through libwebp's animation decoder, whose RGBA canvases and Pillow's copy of a
# frame are alive with the image (a 9 MP WebP peaked at 16-19 B/px in all, against the 8 counted
# before; 24 are counted now; tests/data/test_decode_box.py measures it).
DECODER_BYTES = {"WEBP": 16}


def decoded_bytes(
    mode: str,
    width: int,
    height: int,
    *,
    scale: int = 1,
    coefficients: int = 0,
    format: str | None = None,
) -> int:
    """The most memory (bytes) decoding a ``mode`` image of ``width`` x ``height`` at
    1/``scale`` (a JPEG draft) and making it upright RGB holds at once. ``coefficients``: the
    channels whose full-size DCT coefficients the decoder keeps (a progressive JPEG's);
    ``format``: Pillow's name of the file format (its decoder's own buffers,
    :data:`DECODER_BYTES`)."""
    out = -(-width // scale) * -(-height // scale)
    stored = _STORED_BYTES.get(mode, 4)
    if mode == "RGB":
        peak = stored
    elif mode in _HIGH_BIT_MODES:
        peak = max(stored + 1, 1 + 4)  # the 8-bit gray made band by band; then gray and RGB
    else:
        peak = stored + 4
    decoder = DECODER_BYTES.get(format or "", 0) * width * height
    return out * max(peak, MIN_PEAK_BYTES) + width * height * 2 * coefficients + decoder


def to_rgb(image: Image.Image, *, release: bool = False) -> Image.Image:
    """``image`` (loaded) as 8-bit RGB; see the module docstring. ``release``: close
    ``image`` (free its pixels) as soon as they are not needed, unless it is returned."""
    mode = image.mode
    if mode == "RGB" and "transparency" not in image.info:
        return image
    if mode in _HIGH_BIT_MODES:
        gray = _high_bit_to_gray(image)
        if release:
            image.close()
        return gray.convert("RGB")
    if "transparency" in image.info and mode in {"P", "L", "RGB", "1"}:
        rgb = _composite_on_white(image)  # the tRNS colour / palette transparency
    elif mode in _ALPHA_MODES:
        rgb = _composite_on_white(image)
    else:
        rgb = image.convert("RGB")  # L, 1, P, CMYK, YCbCr, HSV
    if release:
        image.close()
    return rgb


def _bands(image: Image.Image, bytes_per_pixel: int):
    """(top row, band image) for the rows of ``image``, a few MB at a time."""
    width, height = image.size
    rows = max(1, BAND_BYTES // max(1, width * bytes_per_pixel))
    for top in range(0, height, rows):
        yield top, image.crop((0, top, width, min(height, top + rows)))


def _composite_on_white(image: Image.Image) -> Image.Image:
    """RGB of ``image`` with its transparency composited on white, band by band."""
    result = Image.new("RGB", image.size)
    for top, band in _bands(image, 4):
        rgba = band.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*_WHITE, 255))
        result.paste(Image.alpha_composite(background, rgba).convert("RGB"), (0, top))
    return result


def _high_bit_to_gray(image: Image.Image) -> Image.Image:
    """16-bit, 32-bit integer and float grayscale to 8 bits, band by band (two passes: the
    value range first).

    16-bit modes use their full range (v / 257: 0 -> 0, 65535 -> 255). Mode ``I`` (32-bit) holds
    8-bit data, 16-bit data (older Pillow opens 16-bit PNGs that way) or anything else: values in
    0..255 are kept, values in 0..65535 are scaled as 16-bit, others are stretched min..max.
    Float images in 0..1 are scaled by 255; other float ranges are stretched min..max.
    """
    low, high = np.inf, -np.inf
    for _, band in _bands(image, 8):
        values = _values(band)
        if values.size:
            low, high = min(low, float(values.min())), max(high, float(values.max()))
    if low > high:  # no pixels
        low = high = 0.0
    gray = Image.new("L", image.size)
    for top, band in _bands(image, 8):
        scaled = _high_bit_scale(_values(band), image.mode, low, high)
        gray.paste(Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8)), (0, top))
    return gray


def _values(band: Image.Image) -> np.ndarray:
    values = np.asarray(band).astype(np.float64)
    return np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)


def _high_bit_scale(values: np.ndarray, mode: str, low: float, high: float) -> np.ndarray:
    if mode.startswith("I;16"):
        return values / 257.0
    if mode == "F" and low >= 0.0 and high <= 1.0:
        return values * 255.0
    if low >= 0.0 and high <= 255.0:
        return values
    if mode == "I" and low >= 0.0 and high <= 65535.0:
        return values / 257.0
    return (values - low) * (255.0 / (high - low)) if high > low else values * 0.0
