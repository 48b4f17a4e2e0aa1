"""The model a gallery was built with: which file embeds its queries, and the check that a
model is that one (same dim and sha256; a gallery imported without a model checks the dim)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.store import GalleryError
from nearsight.models.spec import ModelSpec, spec_from_gallery_meta

if TYPE_CHECKING:  # typing only: the embedders' modules load onnxruntime
    from nearsight.models.embedder import Embedder


class Gallery(Protocol):
    """What this module reads of a gallery (nearsight.index.gallery.core's, which imports
    this module)."""

    path: Path
    dim: int
    meta: dict[str, Any]
    model_sha256: str


def model_path(gallery: Gallery, override: str | os.PathLike[str] | None = None) -> Path:
    """The model to embed queries with: ``override``, else the one the gallery records
    (one-line NearsightError when it records none or the file is gone)."""
    if override is not None:
        return Path(override)
    recorded = gallery.meta.get("model")
    if not recorded and not gallery.model_sha256:
        raise NearsightError(
            f"gallery {gallery.path} was imported without a model: search it by --id or "
            f"--vector, or pass --model (a model of dim {gallery.dim}) to search by image"
        )
    if not recorded:
        raise NearsightError(f"gallery {gallery.path} does not record its model: pass --model")
    path = Path(str(recorded))
    if not path.is_file():
        raise NearsightError(
            f"the model gallery {gallery.path} was built with is not at {path} any more: "
            "pass --model"
        )
    return path


def check_model(
    gallery: Gallery, model: Embedder, name: str | os.PathLike[str] | None = None
) -> None:
    """GalleryError unless ``model`` (``dim``, ``model_sha256``) is the gallery's model."""
    model_dim = int(model.dim)
    model_sha = str(model.model_sha256)
    if model_dim == gallery.dim and model_sha == gallery.model_sha256:
        return
    if model_dim == gallery.dim and not gallery.model_sha256:
        return  # imported vectors of an unrecorded model: the dim is all there is to check
    label = os.fspath(name) if name is not None else getattr(model, "path", None) or "MODEL"
    raise GalleryError(
        f"gallery {gallery.path} was built with model sha256 {gallery.model_sha256[:12]}.. "
        f"(dim {gallery.dim}) but {label} is {model_sha[:12]}.. (dim {model_dim}): rebuild the "
        "gallery or pass the model it was built with"
    )


def load_model(
    gallery: Gallery,
    override: str | os.PathLike[str] | None = None,
    *,
    device: str = "auto",
    optimization: str = "all",
) -> Embedder:
    """The embedder of ``gallery``'s queries: ``override`` or its recorded model, run as its
    recorded spec says when that is a model exported elsewhere (models.foreign), and checked
    to be the model the gallery was built with."""
    from nearsight.models.loading import load_embedder

    path = model_path(gallery, override)
    spec = foreign_spec(gallery)
    embedder = load_embedder(path, device=device, optimization=optimization, spec=spec)
    check_model(gallery, embedder, path)
    return embedder


def foreign_spec(gallery: Gallery) -> ModelSpec | None:
    """The recorded spec when the gallery was built with a model exported elsewhere (which
    only the spec tells how to run), else None (a nearsight model describes itself)."""
    spec = spec_from_gallery_meta(gallery.meta)
    return spec if spec is not None and spec.foreign else None
