"""The small data the examples of README.md and docs/*.md run against, under the names the docs
use: a synthetic dataset, a random ResNet-18 checkpoint and its ONNX export, galleries built
with it (``shop``, ``G``, ``TEST``, ``VAL``, the demo's ``runs/demo/gallery-ice``), a stand-in
for a CLIP image tower, query images. Built once per session; each document runs in its own
copy (:func:`copy_workspace`), so what one document changes no other sees."""

from __future__ import annotations

import csv
import os
import shutil
import warnings
from pathlib import Path

from PIL import Image

from nearsight.app.cli import main

SIZE, DIM = 32, 8  # the network: a random ResNet-18, 8-d embeddings of 32 px images
CLASSES, PER_CLASS = 8, 6  # train: classes 0-3, test: classes 4-7
SHOPS = ("north", "south")
PHOTO_SIZE = (768, 576)  # the short side is twice the CLIP stand-in's resize: a draft decode
# files this large are linked into each document's copy, not copied
LINK_ABOVE_BYTES = 1 << 20


def build_workspace(root: Path) -> Path:
    """Everything the examples name, in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    synth = root / "data" / "synth"
    _cli("data", "synth", "--out", synth, "--classes", CLASSES, "--per-class", PER_CLASS,
         "--size", SIZE)  # fmt: skip
    test_images = sorted((synth / "test").rglob("*.png"))
    model = _model(root / "run" / "best.pt", root / "model.onnx")

    _shop_manifest(root / "products.csv", sorted(synth.rglob("*.png")))
    _build(model, root / "shop", "--dataset", "csv", "--root", root / "products.csv")
    _build(model, root / "G", "--dataset", "folder", "--root", synth, "--split", "test")
    _build(model, root / "TEST", "--dataset", "folder", "--root", synth, "--split", "test")
    _build(model, root / "VAL", "--dataset", "folder", "--root", synth, "--split", "train")

    # a query a user would have: a JPEG, not one of the shop's files
    Image.open(test_images[0]).convert("RGB").save(root / "query.jpg", quality=95)
    (root / "photos").mkdir()
    for image in test_images[1:4]:
        shutil.copy(image, root / "photos" / f"{image.parent.name}-{image.name}")

    # a catalog of photos large enough to be decoded at a reduced scale, and one of them again
    (root / "jpegs").mkdir()
    with open(root / "catalog.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        for image in test_images:
            photo = root / "jpegs" / f"{image.parent.name}-{image.stem}.jpg"
            Image.open(image).convert("RGB").resize(PHOTO_SIZE).save(photo, quality=90)
            writer.writerow([photo.relative_to(root), image.parent.name])
    shutil.copy(root / "jpegs" / f"{test_images[0].parent.name}-{test_images[0].stem}.jpg",
                root / "photo.jpg")  # fmt: skip
    _clip_stand_in(root / "clip-vision.onnx")

    # what `make demo` leaves in runs/demo, under its names
    demo = root / "runs" / "demo"
    (demo / "run-ice").mkdir(parents=True)
    (demo / "data").symlink_to(Path("..", "..", "data", "synth"))
    (demo / "model-ice.onnx").symlink_to(Path("..", "..", "model.onnx"))
    (demo / "run-ice" / "best.pt").symlink_to(Path("..", "..", "..", "run", "best.pt"))
    shutil.copytree(root / "G", demo / "gallery-ice")
    return root


def copy_workspace(pristine: Path, out: Path) -> Path:
    """A copy of ``pristine`` that a document may change: small files copied, large ones
    (the models) linked, symlinks kept as they are."""

    def copy(source: str, target: str) -> None:
        if os.path.getsize(source) > LINK_ABOVE_BYTES:
            os.symlink(source, target)
        else:
            shutil.copy2(source, target)

    shutil.copytree(pristine, out, symlinks=True, copy_function=copy)
    return out


def _cli(*argv: object) -> None:
    code = main([str(arg) for arg in argv])
    assert code == 0, f"nearsight {' '.join(map(str, argv))} exited with {code}"


def _build(model: Path, out: Path, *source: object) -> None:
    _cli("index", "build", "--model", model, *source, "--out", out, "--workers", 0)


def _model(checkpoint: Path, onnx: Path) -> Path:
    """A random ResNet-18 checkpoint and its ONNX export: the smallest network nearsight
    trains, so the examples' export and embedding stay quick."""
    import torch

    import nearsight
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

    torch.manual_seed(0)
    checkpoint.parent.mkdir(parents=True)
    config = EmbeddingConfig(dim=DIM, image_size=SIZE, arch="resnet18", pretrained="none")
    save_checkpoint(checkpoint, build_embedding_net(config))
    nearsight.export(checkpoint, onnx)
    return onnx


def _shop_manifest(path: Path, images: list[Path]) -> None:
    """A shop's catalog: shop, price and a text SKU for every image."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "shop", "price", "sku"])
        for number, image in enumerate(images):
            shop, price, sku = SHOPS[number % 2], f"{number * 1.5:.1f}", f"{number:04d}"
            writer.writerow([image.relative_to(path.parent), image.parent.name, shop, price, sku])


def _clip_stand_in(path: Path) -> Path:
    """A graph shaped like a CLIP image tower (not one: a single convolution): input
    ``pixel_values`` [N, 3, 224, 224], outputs ``last_hidden_state`` [N, 196, 16] and
    ``image_embeds`` [N, 16], no nearsight metadata."""
    import torch

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patches = torch.nn.Conv2d(3, 16, kernel_size=16, stride=16)

        def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            hidden = self.patches(pixel_values).flatten(2).transpose(1, 2)
            return hidden, hidden.mean(dim=1)

    torch.manual_seed(0)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notes
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            Tower().eval(),
            (torch.zeros(1, 3, 224, 224),),
            str(path),
            input_names=["pixel_values"],
            output_names=["last_hidden_state", "image_embeds"],
            dynamic_axes={"pixel_values": {0: "n"}, "image_embeds": {0: "n"}},
            dynamo=False,
        )
    return path
