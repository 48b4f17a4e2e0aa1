"""Small galleries for the tests: an exported ONNX model over a few synthetic classes, and the
scikit-learn digits as an image folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ONNX_CLASSES, ONNX_PER_CLASS, ONNX_SIZE, ONNX_DIM = 4, 3, 32, 8


@dataclass
class OnnxGallery:
    data: Path  # the image folder (class folders)
    checkpoint: Path
    model: Path  # model.onnx exported from ``checkpoint``
    gallery: Path  # built from ``data`` with ``model``
    query: Path  # one of the gallery's images


def make_onnx_gallery(root: Path, seed: int = 0) -> OnnxGallery:
    """A random resnet18 (8-d, 32 px) exported to ONNX and a gallery of 4 x 3 synthetic images
    built with it by the CLI."""
    import torch

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
    from nearsight.models.export import export_onnx

    data = root / "data"
    write_synthetic(data, classes=ONNX_CLASSES, per_class=ONNX_PER_CLASS, size=ONNX_SIZE)
    torch.manual_seed(seed)
    checkpoint = root / "model.pt"
    config = EmbeddingConfig(dim=ONNX_DIM, image_size=ONNX_SIZE, arch="resnet18")
    save_checkpoint(checkpoint, build_embedding_net(config))
    model = root / "model.onnx"
    export_onnx(checkpoint, model)
    gallery = root / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(data)]
    assert main([*argv, "--split", "all", "--out", str(gallery), "--workers", "0"]) == 0
    query = next(path for path in sorted(data.rglob("*.png")))
    return OnnxGallery(data, checkpoint, model, gallery, query)


def write_digits(root: Path, *, size: int = 32, test_per_class: int | None = None) -> Path:
    """scikit-learn's bundled handwritten digits (8x8, 10 classes; nothing downloaded) as RGB
    PNGs upscaled to ``size`` px in an image folder (``ROOT/digit_K/NNNN.png``): the folder
    loader splits it class-disjointly, digits 0-4 train and 5-9 test, the test classes cut to
    their first ``test_per_class`` images when given. Returns ``root``."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    kept = {digit: 0 for digit in range(10)}
    for number, (pixels, digit) in enumerate(zip(digits.images, digits.target, strict=True)):
        kept[digit] += 1
        if digit >= 5 and test_per_class is not None and kept[digit] > test_per_class:
            continue
        folder = root / f"digit_{digit}"
        folder.mkdir(parents=True, exist_ok=True)
        grey = Image.fromarray(np.uint8(np.round(pixels * 255 / 16)), mode="L")
        grey = grey.resize((size, size), Image.Resampling.BILINEAR)
        grey.convert("RGB").save(folder / f"{number:04d}.png")
    return root
