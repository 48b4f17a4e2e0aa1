"""What a page user uploaded (or pasted), read and decoded as a query image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nearsight.app.page.inputs import PageError
from nearsight.data.image_input import QueryImage, query_from_bytes


def read_upload(path: str | bytes | None, embedder: Any) -> QueryImage:
    """The uploaded file (its path in Gradio's upload folder, or a pasted image's bytes),
    decoded in the decode box and fitted to ``embedder``'s resize."""
    if not path:
        raise PageError("no query image: upload, paste or drop one")
    if isinstance(path, bytes):
        data, name = path, "pasted image"
    else:
        file = Path(path)
        name = file.name
        try:
            data = file.read_bytes()
        except OSError as error:
            raise PageError(f"cannot read the upload: {error.strerror or error}") from None
    return query_from_bytes(data, name, embedder.resize, embedder.spec.interpolation)
