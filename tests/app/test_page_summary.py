"""The page's Summary tab states the gallery's true vector width (heads x dim, and which
embedding) and the test-time preprocessing the model really applies: the numbers it prints
rebuild the gallery's stored vectors."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAST
from PIL import Image

from nearsight.app.cli import main
from nearsight.app.page.layout import build_app
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.export import export_onnx

HEADS = ["layer2", "layer3", "layer4"]
DIM, SIZE, RESIZE = 8, 40, 52  # a test resize other than the default ratio's (46)


def build(root: Path, embedding: str) -> tuple[Path, EmbeddingNet]:
    """A random three-head resnet18 (``embedding``: concat or last) with a test resize of
    RESIZE, exported to ONNX (fp32, as served), and its gallery of synthetic 64 px images
    built by the CLI."""
    torch.manual_seed(0)
    config = EmbeddingConfig(dim=DIM, image_size=SIZE, arch="resnet18", heads=HEADS,
                             embedding=embedding)  # fmt: skip
    net = EmbeddingNet(config).eval()
    checkpoint = save_checkpoint(
        root / f"{embedding}.pt", net, spec=config.spec(test_resize=RESIZE)
    )
    model = root / f"{embedding}.onnx"
    export_onnx(checkpoint, model)
    data = root / "data"
    if not data.exists():
        write_synthetic(data, classes=3, per_class=3, size=64)
    gallery = root / f"gallery-{embedding}"
    argv = ["index", "build", "--model", model, "--dataset", "folder", "--root", data]
    assert main([str(arg) for arg in [*argv, "--split", "all", "--out", gallery, *FAST]]) == 0
    return gallery, net


@pytest.fixture(scope="module")
def galleries(tmp_path_factory) -> Iterator[dict[str, tuple[Path, EmbeddingNet]]]:
    root = tmp_path_factory.mktemp("summary")
    yield {embedding: build(root, embedding) for embedding in ("concat", "last")}
    shutil.rmtree(root, ignore_errors=True)


def summary_of(gallery: Path) -> str:
    """The Summary tab's markdown, from the page's own handler."""
    page = build_app([gallery], device="cpu", analyse=False).nearsight
    try:
        return page.analysis_outputs(page.names[0])[4]
    finally:
        page.close()


def preprocess(path: str, resize: int, crop: int) -> torch.Tensor:
    """Short side to ``resize`` (bilinear, antialiased), then the centre ``crop`` square."""
    image = Image.open(path).convert("RGB")
    scale = resize / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)),
                         Image.Resampling.BILINEAR)  # fmt: skip
    left, top = (image.width - crop) // 2, (image.height - crop) // 2
    image = image.crop((left, top, left + crop, top + crop))
    return torch.from_numpy(np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255)


@pytest.mark.parametrize(
    ("embedding", "width", "which"),
    [
        ("concat", 3 * DIM, "(3 heads x 8: layer2, layer3, layer4, concatenated)"),
        ("last", DIM, "(the layer4 head of 3: the last embedding)"),
    ],
)
def test_the_summary_gives_the_stored_width_and_the_preprocessing_used(
    galleries, embedding, width, which
):
    gallery, net = galleries[embedding]
    summary = summary_of(gallery)
    assert f"dim {width} {which}" in summary, summary
    with Gallery.open(gallery) as opened:
        stored = np.array(opened.embeddings)
        items = opened.all_items()
    assert stored.shape[1] == width

    found = re.search(r"short side resized to (\d+) px, centre crop (\d+) x (\d+)", summary)
    assert found, summary
    resize, crop, crop_again = map(int, found.groups())
    assert (resize, crop, crop_again) == (RESIZE, SIZE, SIZE)
    # the stated numbers reproduce what the gallery holds (and the default ratio would not)
    images = torch.stack([preprocess(item["path"], resize, crop) for item in items])
    with torch.no_grad():
        rebuilt = net(images).numpy()
    np.testing.assert_allclose(rebuilt, stored, atol=1e-4)
    default = torch.stack([preprocess(item["path"], round(SIZE * 256 / 224), crop)
                           for item in items])  # fmt: skip
    with torch.no_grad():
        assert np.abs(net(default).numpy() - stored).max() > 1e-3
