"""JPEG decoding through libjpeg-turbo's TurboJPEG API (simplejpeg), straight into an RGB array.

Pillow runs the same libjpeg-turbo with the same settings (accurate integer DCT, fancy
upsampling), so the pixels are identical to ``Image.open(...).convert("RGB")``, at every DCT
scale (``tests/data/test_draft_decode.py`` checks it); what it saves is Pillow's buffered read loop
and its unpacking into 4-byte pixels. Only YCbCr/RGB and grayscale JPEGs come here: CMYK and
anything else TurboJPEG refuses go back to Pillow, which also words the errors.
"""

from __future__ import annotations

import math

import numpy as np
import simplejpeg

# Pillow's JPEG modes whose conversion to RGB TurboJPEG makes bit for bit as Pillow does
FAST_MODES = ("RGB", "L")


def decode_rgb(data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray | None:
    """[H/scale, W/scale, 3] uint8 RGB of a ``width`` x ``height`` JPEG decoded at 1/``scale``
    (1, 2, 4 or 8: libjpeg's DCT scaling, as Pillow's draft mode picks it), or None where
    TurboJPEG cannot read the data (truncated, corrupt, an unusual layout)."""
    try:
        # TurboJPEG picks the smallest scaling factor that keeps both minimums: exactly 1/scale
        return simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            min_width=math.ceil(width / scale),
            min_height=math.ceil(height / scale),
        )
    except (ValueError, RuntimeError):
        return None
