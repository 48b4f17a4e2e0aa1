"""The SHA-256 of a file's bytes: the one hash that names models, galleries' images and
stored stage models."""

from __future__ import annotations

import hashlib
import os

from nearsight.core.errors import NearsightError


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (galleries can hold large files); a
    one-line NearsightError naming the file when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as error:
        raise NearsightError(
            f"cannot read file {os.fspath(path)}: {error.strerror or error}"
        ) from None
