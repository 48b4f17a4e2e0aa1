"""ONNX export of timm trunks, one family each (ViT, ConvNeXt, ResNet): parity with torch within
1e-4 on two batch sizes (so N is dynamic), the spec in the metadata, the bicubic test transform,
and the int8 copy with its measured cosine."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from helpers import TIMM_CONVNEXT, TIMM_RESNET, TIMM_VIT
from PIL import Image

from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.models import preprocess
from nearsight.models.checkpoint import load_embedding_net, save_checkpoint
from nearsight.models.embedder import OnnxEmbedder
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
from nearsight.models.export import PARITY_TOLERANCE, export_onnx
from nearsight.models.loading import load_embedder
from nearsight.models.quantize import CPU_ONLY
from nearsight.models.spec import spec_from_checkpoint

FAMILIES = {
    "vit": {"arch": TIMM_VIT, "pooling": "token"},
    "convnext": {
        "arch": TIMM_CONVNEXT,
        "pooling": "gem",
        "heads": ["stages.1", "stages.2", "stages.3"],
        "embedding": "concat",
    },
    "resnet": {"arch": TIMM_RESNET, "pooling": "avgmax", "feature_norm": "batchnorm"},
}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("timm-images")
    write_synthetic(root, classes=4, per_class=4, size=48, seed=1)
    return sorted(root.rglob("*.png"))


def checkpoint(tmp_path, family: str, size: int = 32):
    torch.manual_seed(0)
    net = build_embedding_net(EmbeddingConfig(dim=8, image_size=size, **FAMILIES[family]))
    if net.config.feature_norm == "batchnorm":  # statistics that a fold must get right
        net.train()
        with torch.no_grad():
            net(torch.rand(8, 3, size, size))
    return save_checkpoint(tmp_path / f"{family}.pt", net)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_matches_torch_for_each_family(family, tmp_path):
    path = checkpoint(tmp_path, family)
    report = export_onnx(path, tmp_path / "model.onnx")
    assert report.max_abs_diff <= PARITY_TOLERANCE
    assert report.parity_batches == (4, 1)
    model = onnx.load(str(report.path))
    meta = {entry.key: entry.value for entry in model.metadata_props}
    spec = spec_from_checkpoint(torch.load(path, weights_only=True))
    assert json.loads(meta["model_spec"]) == spec.to_dict()
    assert spec.interpolation in ("bicubic", "bilinear") and len(spec.mean) == 3
    # a batch size the parity check did not use: N is dynamic
    net = load_embedding_net(path)
    batch = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = net(batch).numpy()
    got = OnnxEmbedder(report.path, providers=CPU_ONLY).embed(batch.numpy())
    assert np.abs(got - expected).max() <= PARITY_TOLERANCE


def test_the_embedder_resizes_as_the_spec_says(tmp_path, images):
    report = export_onnx(checkpoint(tmp_path, "vit"), tmp_path / "model.onnx")
    embedder = load_embedder(report.path, device="cpu")
    assert embedder.spec.interpolation == "bicubic" and embedder.resize == 33
    with Image.open(images[0]) as image:
        picture = image.convert("RGB")
    bicubic = preprocess.test_transform(32, 33, "bicubic")(picture)
    bilinear = preprocess.test_transform(32, 33, "bilinear")(picture)
    assert not np.array_equal(bicubic, bilinear)
    np.testing.assert_array_equal(embedder.preprocess(picture), bicubic)


@pytest.mark.parametrize("family", ["vit", "convnext"])
def test_int8_copy_with_its_measured_cosine(family, tmp_path, images):
    report = export_onnx(
        checkpoint(tmp_path, family), tmp_path / "model.onnx", int8_calibration=images
    )
    assert report.int8 is not None and report.int8.path.is_file()
    assert report.int8.calibration_images == len(images)
    assert 0.9 <= report.int8.cosine_min <= report.int8.cosine_mean <= 1.0 + 1e-6
    int8 = OnnxEmbedder(report.int8.path, providers=CPU_ONLY)
    assert int8.metadata["precision"] == "int8" and int8.spec.interpolation == "bicubic"
