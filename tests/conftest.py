"""Test helpers shared by several test files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

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
    from nearsight.index.datasets.synthetic import write_synthetic
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


@pytest.fixture(scope="session")
def onnx_gallery(tmp_path_factory) -> OnnxGallery:
    return make_onnx_gallery(tmp_path_factory.mktemp("onnx-gallery"))
