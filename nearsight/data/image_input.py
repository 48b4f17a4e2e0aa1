"""A query image as Python code hands it over: a file path, bytes, a PIL image or a numpy array,
turned into an RGB PIL image, with the sha256 of its file's bytes where there are bytes (so a
search can recognise a gallery's own file)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import fit_bytes, fit_file
from nearsight.data.images import load_image

ImageLike = str | os.PathLike[str] | Image.Image | np.ndarray


@dataclass(frozen=True)
class QueryImage:
    image: Image.Image  # RGB
    sha256: str | None  # of the file's bytes; None for an image handed over decoded


def read_query(
    image: ImageLike, min_side: int | None = None, interpolation: str = "bilinear"
) -> QueryImage:
    """``image`` decoded (one-line NearsightError for a missing or unreadable file, or a
    wrong array). A file is decoded in the decode box (nearsight.data.decode_box) and comes
    back fitted to ``min_side`` (the model's resize, with its ``interpolation``): the pixels
    the test transform would make of it, no more."""
    if isinstance(image, str | os.PathLike):
        if min_side is None:
            return QueryImage(load_image(Path(image)), file_sha256(image))
        decoded = fit_file(Path(image), min_side, interpolation).image
        return QueryImage(decoded, file_sha256(image))
    return QueryImage(as_image(image), None)


def query_from_bytes(
    data: bytes, name: str, min_side: int, interpolation: str = "bilinear"
) -> QueryImage:
    """An uploaded file's bytes as a :class:`QueryImage`, decoded in the decode box and
    fitted to ``min_side`` (as :func:`read_query`)."""
    decoded = fit_bytes(data, name, min_side, interpolation).image
    return QueryImage(decoded, hashlib.sha256(data).hexdigest())


def as_image(image: ImageLike, min_side: int | None = None) -> Image.Image:
    """A query as an RGB PIL image: a PIL image, an array H x W (x 3 or 4) of uint8 or of
    floats in [0, 1], or a file path."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray):
        array = image
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
            raise NearsightError(
                f"an image array must be H x W, H x W x 3 or H x W x 4, got shape {list(image.shape)}"
            )
        if array.dtype != np.uint8:
            if not np.issubdtype(array.dtype, np.floating):
                raise NearsightError(f"an image array must be uint8 or float, got {array.dtype}")
            array = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        return Image.fromarray(np.ascontiguousarray(array)).convert("RGB")
    if isinstance(image, str | os.PathLike):
        return load_image(Path(image), min_side)
    raise NearsightError(
        f"a query image is a file path, a PIL image or a numpy array, not {type(image).__name__}"
    )
