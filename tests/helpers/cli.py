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


def make_staged_gallery(root: Path, model: Path) -> dict:
    """A gallery of 4 synthetic test classes built with ``model`` (the session's ONNX one),
    a layer3 re-ranker trained for it on the 4 train classes (rerank train --stage layer3),
    and the gallery's stored layer3 features (rerank features); ``query``: a train-split
    image, so not any item's file. ``spec`` re-ranks with ``shuffler``, a layer3 re-ranker of
    random weights: two epochs on 16 images learn to keep the base order, a random one
    re-orders by the features it is given, so a test of which features reach it can fail."""
    from nearsight.app.cli import main
    from nearsight.core.digest import file_sha256
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.training.pairwise import export_scorer

    data = root / "data"
    write_synthetic(data, classes=8, per_class=4, size=32, seed=3)
    gallery = root / "gallery"
    build = ["index", "build", "--model", str(model), "--dataset", "folder"]
    assert main([*build, "--root", str(data), "--split", "test", "--out", str(gallery)]) == 0
    out = root / "staged.onnx"
    argv = [
        "rerank",
        "train",
        "--model",
        str(model),
        "--dataset",
        "folder",
        "--root",
        str(data),
        "--out",
        str(out),
        "--depth",
        "4",
        "--epochs",
        "2",
        "--stage",
        "layer3",
        "--json",
    ]
    assert main(argv) == 0
    assert main(["rerank", "features", "--gallery", str(gallery), "--stage", "layer3"]) == 0
    shuffler = root / "shuffler.onnx"
    export_scorer(random_stage_scorer(out, seed=0), shuffler, file_sha256(model),
                  {"side_stage": "layer3"})  # fmt: skip
    queries = sorted((data / "train").rglob("*.png"))  # the gallery holds the test split
    return {"data": data, "gallery": gallery, "reranker": out, "model": model,
            "shuffler": shuffler, "spec": f"pairwise:model={shuffler},depth=4",
            "trained_spec": f"pairwise:model={out},depth=4", "query": queries[0],
            "queries": queries}  # fmt: skip


def random_stage_scorer(like: Path, seed: int):
    """A stage PairScorer of the width of re-ranker file ``like``, its MLP's weights random
    (an untrained one keeps the base order: its last layer starts at zero)."""
    import torch

    from nearsight.search.rerank.pairwise import PairwiseReranker
    from nearsight.training.pairwise import PairScorer

    opened = PairwiseReranker(like)
    torch.manual_seed(seed)
    scorer = PairScorer(opened.dim, elementwise=False, side_dim=opened.side_dim)
    for parameter in scorer.mlp.parameters():
        torch.nn.init.normal_(parameter, std=1.0)
    return scorer.eval()


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
