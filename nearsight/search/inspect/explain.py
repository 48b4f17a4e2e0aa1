"""Why two gallery items match: their similarity drawn over both images
(:mod:`nearsight.models.similarity_map`: the pooled similarity decomposed over the feature map's
locations). The network comes from the gallery's model when it is a checkpoint; a gallery of an
ONNX model needs the checkpoint it was exported from (given, or found beside the model by the
sha256 the ONNX file records). torch is imported only here, when a map is made."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from nearsight.core.atomic import atomic_file
from nearsight.core.errors import NearsightError
from nearsight.data.embed import ImagePaths
from nearsight.index.gallery.core import Gallery
from nearsight.models.similarity_map import SimilarityMaps, no_map_reason
from nearsight.models.spec import spec_from_gallery_meta
from nearsight.search.inspect.items import GalleryLike, opened

PANEL_SIDE = 256  # pixels of each image in the drawing
CHECKPOINT_SEARCH_FILES = 20  # .pt files hashed at most when looking for an ONNX's checkpoint
CAPTION_HEIGHT = 36


@dataclass
class Explanation:
    """Two items' similarity maps, and the images they were drawn over (model input crops)."""

    ids: tuple[int, int]
    maps: SimilarityMaps
    images: tuple[Image.Image, Image.Image]

    @property
    def similarity(self) -> float:
        return self.maps.similarity


def explain_pair(
    gallery: GalleryLike,
    id_a: int,
    id_b: int,
    checkpoint: str | os.PathLike[str] | None = None,
) -> Explanation:
    """The similarity maps of items ``id_a`` and ``id_b`` of ``gallery``."""
    from nearsight.models.similarity_map import SimilarityMapper

    with opened(gallery) as open_gallery:
        spec = spec_from_gallery_meta(open_gallery.meta)
        if spec is not None and (reason := no_map_reason(spec)) is not None:
            raise NearsightError(f"no similarity map: {reason}")
        rows = open_gallery.items([id_a, id_b])
        source = find_checkpoint(open_gallery, checkpoint)
    mapper = SimilarityMapper(source)
    embedder = mapper.embedder
    # decoded, fitted and transformed as the gallery's build did (data.embed)
    inputs = ImagePaths([row["path"] for row in rows], embedder.image_size, embedder.resize,
                        embedder.spec.interpolation)  # fmt: skip
    pixels = []
    for index in range(2):
        _, array, error, _ = inputs[index]
        if array is None:
            raise NearsightError(error)
        pixels.append(array)
    maps = mapper.maps(pixels[0], pixels[1])
    crops = (_as_image(pixels[0]), _as_image(pixels[1]))
    return Explanation(ids=(int(id_a), int(id_b)), maps=maps, images=crops)


def find_checkpoint(gallery: Gallery, given: str | os.PathLike[str] | None) -> Path:
    """The checkpoint of the gallery's network: ``given``, the gallery's model when it is one,
    or a ``.pt`` beside its ONNX model (or one folder down) with the sha256 the ONNX records."""
    if given is not None:
        return Path(given)
    model = gallery.model_path()
    if model.suffix.lower() in (".pt", ".pth"):
        return model
    from nearsight.models.embedder import OnnxEmbedder, file_sha256

    wanted = OnnxEmbedder(model).metadata.get("checkpoint_sha256", "")
    folder = model.resolve().parent
    nearby = sorted(folder.glob("*.pt")) + sorted(folder.glob("*/*.pt"))
    for candidate in nearby[:CHECKPOINT_SEARCH_FILES]:
        if wanted and file_sha256(candidate) == wanted:
            return candidate
    raise NearsightError(
        f"the gallery's model {model.name} is an ONNX file and no checkpoint beside it has the "
        "sha256 it was exported from: pass --checkpoint RUN/best.pt"
    )


def draw(explanation: Explanation, out: str | os.PathLike[str]) -> None:
    """Write :func:`picture` as a PNG file."""
    with atomic_file(out, "wb") as handle:
        picture(explanation).save(handle, format="PNG")


def picture(explanation: Explanation) -> Image.Image:
    """Both images side by side, each location tinted by its share of the similarity (red:
    adds to it, blue: takes from it; one scale for both), the similarity written below."""
    maps = explanation.maps
    scale = max(float(np.abs(maps.map_a).max()), float(np.abs(maps.map_b).max()), 1e-12)
    panels = [
        _tinted(image, values, scale)
        for image, values in zip(explanation.images, (maps.map_a, maps.map_b), strict=True)
    ]
    canvas = Image.new("RGB", (2 * PANEL_SIDE + 8, PANEL_SIDE + CAPTION_HEIGHT), "white")
    canvas.paste(panels[0], (0, 0))
    canvas.paste(panels[1], (PANEL_SIDE + 8, 0))
    a, b = explanation.ids
    caption = (
        f"items {a} and {b}: similarity {maps.similarity:.4f} "
        f"(red adds, blue takes; sums {maps.map_a.sum():.4f} / {maps.map_b.sum():.4f})"
    )
    ImageDraw.Draw(canvas).text((6, PANEL_SIDE + 10), caption, fill=(30, 30, 30))
    return canvas


def _tinted(image: Image.Image, values: np.ndarray, scale: float) -> Image.Image:
    side = (PANEL_SIDE, PANEL_SIDE)
    base = np.asarray(image.convert("RGB").resize(side, Image.Resampling.BILINEAR), np.float32)
    field = Image.fromarray((values / scale).astype(np.float32), mode="F")
    strength = np.asarray(field.resize(side, Image.Resampling.BILINEAR), np.float32)
    tint = np.where(strength[..., None] >= 0, [220.0, 30.0, 30.0], [30.0, 60.0, 220.0])
    alpha = 0.6 * np.clip(np.abs(strength), 0, 1)[..., None]
    mixed = (1 - alpha) * base + alpha * tint
    return Image.fromarray(np.clip(mixed, 0, 255).astype(np.uint8))


def _as_image(pixels: np.ndarray) -> Image.Image:
    """A model input [3, S, S] in [0, 1] as an RGB image."""
    return Image.fromarray(np.clip(np.transpose(pixels, (1, 2, 0)) * 255, 0, 255).astype(np.uint8))
