"""The in-process CLI runner and its assertions, and tiny galleries built through the CLI
(a model, a product catalog, a shop)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

FAST = ["--workers", "0"]
CLASSES = 6
PER_CLASS = 4
SHOPS = ("north", "south")


def tiny_model(path: Path, seed: int, dim: int = 16) -> Path:
    """A random resnet18 checkpoint, ``dim``-d at 32 px."""
    import torch

    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet

    torch.manual_seed(seed)
    config = EmbeddingConfig(dim=dim, image_size=32, arch="resnet18", pretrained="none")
    return save_checkpoint(path, EmbeddingNet(config))


def run(capsys, *argv) -> tuple[int, str, str]:
    """``nearsight *argv`` in this process: (exit code, stdout, stderr)."""
    from nearsight.app.cli import main

    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_argv(*argv) -> list[str]:
    """``nearsight *argv`` as a command line for another process (subprocess.run, Popen)."""
    return [sys.executable, "-m", "nearsight.app.cli", *[str(arg) for arg in argv]]


def assert_one_line_error(code: int, err: str, *fragments: str) -> str:
    """Exit 2, no traceback, ONE ``nearsight: error:`` line holding every fragment; returns
    that line."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("nearsight: error:")]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (metrics.jsonl, train.jsonl), blank lines skipped."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class TinyGallery:
    root: Path
    data: Path
    model: Path
    gallery: Path
    secret: Path  # a file outside every gallery folder
    link: Path  # a symlink inside a gallery image folder pointing at ``secret``
    items: list[dict]


def make_tiny_gallery(root: Path, arch: str = "resnet50", seed: int = 2) -> TinyGallery:
    """6 classes x 4 images of 32 px, a random 16-d network and its gallery (built by the CLI).

    Seed 2: the random ResNet-50 gets 4 of the 24 rank-1 neighbours right, so the page shows
    both kinds (seed 0 got none right)."""
    import torch

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.index.gallery.core import Gallery
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

    data = root / "data"
    write_synthetic(data, classes=CLASSES, per_class=PER_CLASS, size=32)
    torch.manual_seed(seed)
    model = root / "model.pt"
    config = EmbeddingConfig(dim=16, image_size=32, arch=arch)
    save_checkpoint(model, build_embedding_net(config))
    gallery = root / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(data)]
    assert main([*argv, "--split", "all", "--out", str(gallery), "--workers", "0"]) == 0
    with Gallery.open(gallery) as opened:
        items = opened.all_items()
    secret = root / "secret.txt"
    secret.write_text("top secret: not an image of any gallery\n")
    link = Path(items[0]["path"]).parent / "link-to-secret.png"
    link.symlink_to(secret)
    return TinyGallery(root, data, model, gallery, secret, link, items)


def make_product(root: Path) -> dict:
    """A CSV manifest with shop, price and sku columns over a synthetic folder dataset (6 x 6
    images of 32 px, all in the test split) and its gallery, built by the CLI with a random
    16-d resnet18: {"root", "images", "gallery", "model"}."""
    import csv

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    write_synthetic(root / "data", classes=6, per_class=6, size=32)
    images = sorted(p for p in (root / "data").rglob("*.png"))
    manifest = root / "data" / "products.csv"
    with open(manifest, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "split", "shop", "price", "sku"])
        for number, image in enumerate(images):
            writer.writerow(
                [
                    image.relative_to(manifest.parent),
                    image.parent.name,
                    "test",
                    SHOPS[number % 2],
                    f"{number * 1.5:.1f}",
                    f"{number:04d}",
                ]
            )
    model = tiny_model(root / "model.pt", seed=0)
    gallery = root / "gallery"
    code = main(["index", "build", "--model", str(model), "--dataset", "csv", "--root",
                 str(manifest), "--out", str(gallery), *FAST])  # fmt: skip
    assert code == 0
    return {"root": root, "images": images, "gallery": gallery, "model": model}


SHOP_NAMES = ("Café", "Bäckerei", "north")
SHOP_SINCE = "2025-06-01"


def make_shop(root: Path) -> dict:
    """A shop's catalog: a CSV with ``added`` (ISO dates, half of them on or after
    :data:`SHOP_SINCE`), ``colour``, ``name`` (unicode), ``price``, ``shop`` (unicode) and
    ``sku`` (the key column, zero-padded, the last column by name; ``colour`` is blank on
    every 7th row) over a synthetic folder dataset (6 x 6 images of 32 px), built by the CLI
    with ``--key-column sku``: {"root", "images", "gallery", "model", "rows"} (rows: the
    CSV's dicts)."""
    import csv
    import datetime as dt

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    write_synthetic(root / "data", classes=6, per_class=6, size=32)
    images = sorted(p for p in (root / "data").rglob("*.png"))
    manifest = root / "data" / "shop.csv"
    rows = []
    for number, image in enumerate(images):
        added = dt.date(2025, 4, 1) + dt.timedelta(days=5 * number)
        rows.append({
            "path": str(image.relative_to(manifest.parent)), "label": image.parent.name,
            "split": "test", "added": added.isoformat(),
            "colour": "" if number % 7 == 0 else ("red", "green", "blue")[number % 3],
            "name": f"Müsli {number}",
            "price": f"{number * 1.5:.2f}", "shop": SHOP_NAMES[number % 3],
            "sku": f"{number:05d}",
        })  # fmt: skip
    with open(manifest, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    model = tiny_model(root / "model.pt", seed=0)
    gallery = root / "gallery"
    code = main(["index", "build", "--model", str(model), "--dataset", "csv", "--root",
                 str(manifest), "--out", str(gallery), "--key-column", "sku", *FAST])  # fmt: skip
    assert code == 0
    return {"root": root, "images": images, "gallery": gallery, "model": model, "rows": rows}
