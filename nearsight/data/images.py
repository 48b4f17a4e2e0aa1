"""The one image loader: any file Pillow reads becomes a decoded 8-bit RGB image (a large JPEG
at 1/2, 1/4 or 1/8 scale when the caller needs no more pixels; JPEGs through TurboJPEG,
:mod:`nearsight.data.jpeg`, with Pillow's pixels).

Every part of nearsight (training, indexing, search, the page) loads images through
:func:`load_image` or :func:`load_image_bytes`, so they all see the same pixels:

- the EXIF orientation is applied (a phone photo taken in portrait stays upright);
- grayscale, palette, CMYK and 16-bit/32-bit/float images become RGB and transparent pixels
  are composited on white (:mod:`nearsight.data.rgb`);
- an image with more than :data:`MAX_PIXELS` pixels, or whose decoding would hold more than
  :data:`MAX_DECODE_BYTES` (estimated from its header: size after JPEG draft, mode and bit
  depth, :func:`nearsight.data.rgb.decoded_bytes`), is refused before it is decoded
  (decompression bomb); only the first frame of an animation or a multi-page file is decoded;
- anything that goes wrong (missing, empty, truncated, corrupt, not an image) raises
  :class:`ImageLoadError` with a one-line message naming the file: never another exception.

:func:`describe_image_file` gives an image file's catalog fields (sha256, loaded width/height).
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import struct
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.data.jpeg import FAST_MODES, decode_rgb
from nearsight.data.rgb import decoded_bytes, to_rgb

# Images with more pixels than this are refused before decoding (64 megapixels, 192 MB as RGB).
MAX_PIXELS = 64_000_000
# ... and so is one whose decoding is estimated to hold more than this: 8 bytes a pixel (a 64 MP
# image of any mode fits), plus 2 a pixel and channel for a progressive JPEG's coefficients.
# Each --concurrency slot of the server decodes one image at a time.
MAX_DECODE_BYTES = 512 * 2**20
_EXIF_ORIENTATION = 0x0112

# What Pillow raises for files it cannot read: besides OSError (truncated data, unknown format)
# its plugins raise SyntaxError (broken PNG chunks), ValueError, struct.error, EOFError,
# IndexError, KeyError and TypeError on malformed headers.
_PIL_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    SyntaxError,
    ValueError,
    TypeError,
    EOFError,
    IndexError,
    KeyError,
    struct.error,
    MemoryError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)

# ``warnings.catch_warnings`` swaps process-wide state; the lock keeps our own concurrent loads
# from interleaving their enter/exit (which would leave the "error" filter installed). Only the
# header parse runs under it, not the decoding.
_WARNINGS_LOCK = threading.Lock()


class ImageLoadError(NearsightError):
    """An image that cannot be read: "cannot read image PATH: reason" (one line)."""

    def __init__(self, message: str, *, path: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.path = path
        self.reason = reason

    @classmethod
    def for_file(cls, name: str, reason: str) -> ImageLoadError:
        reason = " ".join(reason.split())  # one line, whatever the library said
        return cls(f"cannot read image {name}: {reason}", path=name, reason=reason)


MinSide = int | Callable[[int, int], int] | None


def load_image(path: str | os.PathLike[str], min_side: MinSide = None) -> Image.Image:
    """Read the image file at ``path`` as a decoded RGB image (see the module docstring).
    ``min_side``: the short side the caller needs (an int, or a function of the image's width
    and height, upright as it will be returned); a JPEG that large is decoded at 1/2, 1/4 or 1/8 scale when that still leaves
    it (:func:`draft_scale`). Every caller that embeds for one gallery passes the same value,
    so a query equal to a gallery file decodes to the same pixels."""
    return _load_file(path, min_side, as_array=False)


def load_image_pixels(path: str | os.PathLike[str], min_side: MinSide = None) -> np.ndarray:
    """:func:`load_image`'s pixels as an ``[H, W, 3]`` uint8 array; most JPEGs reach it
    without a Pillow image in between (what the training path wants: it resizes with torch)."""
    return _load_file(path, min_side, as_array=True)


def _load_file(
    path: str | os.PathLike[str],
    min_side: MinSide,
    as_array: bool,
    size_out: list[int] | None = None,
):
    name = os.fspath(path)
    try:
        if os.path.isdir(name):
            raise ImageLoadError.for_file(name, "it is a folder, not an image file")
        if os.path.isfile(name) and os.path.getsize(name) == 0:
            raise ImageLoadError.for_file(name, "the file is empty")
        with open(name, "rb") as handle:
            return _decode(handle, name, min_side, as_array, size_out)
    except FileNotFoundError:
        raise ImageLoadError.for_file(name, "no such file") from None
    except PermissionError:
        raise ImageLoadError.for_file(name, "permission denied") from None
    except OSError as error:  # opening the file itself failed
        raise ImageLoadError.for_file(name, error.strerror or str(error)) from None


def load_image_bytes(data: bytes, name: str = "<upload>", min_side: MinSide = None) -> Image.Image:
    """Decode an image held in memory (an upload); ``name`` is what error messages call it,
    ``min_side`` as for :func:`load_image`."""
    return load_image_sized(data, name, min_side)[0]


def load_image_sized(
    source: bytes | str | os.PathLike[str], name: str | None = None, min_side: MinSide = None
) -> tuple[Image.Image, tuple[int, int]]:
    """:func:`load_image_bytes` of bytes, or :func:`load_image` of a path, and the image's
    upright (width, height) at full size (what a catalog records, whatever the draft scale)."""
    size: list[int] = [0, 0]
    if isinstance(source, bytes):
        name = "<upload>" if name is None else name
        if not source:
            raise ImageLoadError.for_file(name, "the file is empty")
        image = _decode(io.BytesIO(source), name, min_side, size_out=size)
    else:
        image = _load_file(source, min_side, as_array=False, size_out=size)
    return image, (size[0], size[1])


def draft_request(width: int, height: int, min_side: MinSide) -> tuple[int, int] | None:
    """The size to ask a JPEG decoder for (Pillow's ``draft``, libjpeg's DCT scaling picks the
    smallest of 1, 1/2, 1/4, 1/8 that is at least this large), or None to decode every pixel.
    A callable ``min_side`` is given ``width`` and ``height``."""
    if min_side is None:
        return None
    need = min_side(width, height) if callable(min_side) else int(min_side)
    short = min(width, height)
    if need <= 0 or short < 2 * need:  # not even half the pixels may go
        return None
    scale = need / short
    return math.ceil(width * scale), math.ceil(height * scale)


def draft_scale(width: int, height: int, request: tuple[int, int] | None) -> int:
    """The DCT scale (1, 2, 4 or 8) Pillow's ``draft`` picks for ``request``: the largest that
    leaves the image at least that large."""
    if request is None:
        return 1
    fits = min(width // request[0], height // request[1])
    return next(scale for scale in (8, 4, 2) if fits >= scale) if fits >= 2 else 1


def describe_image_file(
    path: str | os.PathLike[str], size: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Catalog fields of an image file: sha256 of its bytes, and width/height as loaded (EXIF
    orientation applied). Fields that cannot be read are None (the image was already decoded
    once by the embedder, so this does not judge it). ``size``: the loaded (width, height)
    the decoder reported (the decode box's): the file's header is then not parsed here."""
    info: dict[str, Any] = {"sha256": None, "width": None, "height": None}
    with contextlib.suppress(NearsightError):
        info["sha256"] = file_sha256(path)
    if size is not None:
        info["width"], info["height"] = int(size[0]), int(size[1])
        return info
    with contextlib.suppress(Exception), Image.open(path) as image:  # reads the header only
        width, height = image.size
        # EXIF orientations 5-8 turn the image a quarter: load_image gives height x width
        if image.getexif().get(_EXIF_ORIENTATION, 1) in _QUARTER_TURNS:
            width, height = height, width
        info["width"], info["height"] = int(width), int(height)
    return info


def _decode(
    stream,
    name: str,
    min_side: MinSide = None,
    as_array: bool = False,
    size_out: list[int] | None = None,
):
    """``size_out``: set to the image's upright (width, height) at full size (before a
    JPEG's draft scale)."""
    try:
        with _open_checked(stream, name) as image:
            if image.format != "JPEG":
                _check_budget(image, name)
                image.load()
                orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
                _upright_size(image, orientation, size_out)
                upright = _turned(to_rgb(image, release=True), orientation)
                return np.array(upright) if as_array else upright
            orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
            _upright_size(image, orientation, size_out)
            if callable(min_side) and orientation in _QUARTER_TURNS:
                # the caller sees the image upright: ask with its width and height swapped
                min_side = functools.partial(_swapped, min_side)
            request = draft_request(*image.size, min_side)
            scale = draft_scale(*image.size, request)
            _check_budget(image, name, scale)
            if image.mode in FAST_MODES:
                stream.seek(0)
                pixels = decode_rgb(stream.read(), *image.size, scale)
                if pixels is not None:
                    if as_array and orientation not in _UPRIGHT:
                        return pixels
                    picture = Image.fromarray(pixels)
                    del pixels  # the array is copied: only the picture and its turn are held
                    upright = _turned(picture, orientation)
                    return np.array(upright) if as_array else upright
            if request is not None:
                image.draft("RGB", request)
            image.load()
            upright = _turned(to_rgb(image, release=True), orientation)
        return np.array(upright) if as_array else upright
    except ImageLoadError:
        raise
    except _PIL_ERRORS as error:
        raise ImageLoadError.for_file(name, _reason(error)) from None


def _upright_size(image: Image.Image, orientation: int, size_out: list[int] | None) -> None:
    if size_out is not None:
        width, height = image.size
        size_out[:] = [height, width] if orientation in _QUARTER_TURNS else [width, height]


def _check_budget(image: Image.Image, name: str, scale: int = 1) -> None:
    """Refuse, before decoding, an image whose decoding would hold more than
    :data:`MAX_DECODE_BYTES` (:func:`nearsight.data.rgb.decoded_bytes`; only the first frame
    of an animation or a multi-page file is ever decoded; the array form, for training, adds
    its copy)."""
    width, height = image.size
    progressive = image.format == "JPEG" and bool(image.info.get("progressive"))
    channels = len(image.getbands()) if progressive else 0
    needed = decoded_bytes(
        image.mode, width, height, scale=scale, coefficients=channels, format=image.format
    )
    if needed > MAX_DECODE_BYTES:
        raise ImageLoadError.for_file(
            name,
            f"decoding its {width}x{height} {image.mode} pixels would take about "
            f"{needed / 2**20:.0f} MB, more than the limit of {MAX_DECODE_BYTES / 2**20:.0f} MB "
            "(a possible decompression bomb)",
        )


# EXIF orientation -> the transpose that makes the image upright (as ImageOps.exif_transpose)
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_QUARTER_TURNS = (5, 6, 7, 8)


def _orient(image: Image.Image, orientation: int) -> Image.Image:
    method = _UPRIGHT.get(orientation)
    return image if method is None else image.transpose(method)


def _turned(image: Image.Image, orientation: int) -> Image.Image:
    """:func:`_orient`, closing ``image`` once a turned copy of it is made (ImageOps'
    exif_transpose copies even an upright image; here only the turn and the result are held)."""
    upright = _orient(image, orientation)
    if upright is not image:
        image.close()
    return upright


def _swapped(min_side: Callable[[int, int], int], width: int, height: int) -> int:
    return min_side(height, width)


def _open_checked(stream, name: str) -> Image.Image:
    """Parse the header, refusing decompression bombs (our limit, and Pillow's warning too)."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = Image.open(stream)
    width, height = image.size
    if width * height > MAX_PIXELS:
        image.close()
        raise ImageLoadError.for_file(
            name,
            f"{width}x{height} pixels is more than the limit of {MAX_PIXELS} "
            "(a possible decompression bomb)",
        )
    return image


def _reason(error: BaseException) -> str:
    if isinstance(error, UnidentifiedImageError):
        return "not an image file (or a format Pillow cannot read)"
    if isinstance(error, Image.DecompressionBombWarning | Image.DecompressionBombError):
        return f"too many pixels (a possible decompression bomb): {error}"
    if isinstance(error, MemoryError):
        return "not enough memory to decode it"
    text = str(error).strip()
    if "truncated" in text:
        return f"the file is truncated or corrupt ({text})"
    return text or type(error).__name__
