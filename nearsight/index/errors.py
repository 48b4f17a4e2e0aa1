"""The gallery store's own error."""

from __future__ import annotations

from nearsight.core.errors import NearsightError


class GalleryError(NearsightError):
    """A gallery folder or catalog that is missing, damaged or inconsistent."""
