"""Decode + augment throughput per core, with and without JPEG draft decoding (issue 27).

    python bench/decode.py [--images 200] [--image-size 224] [--json FILE]

For CUB-size (640 x 427) and SOP-size (1536 x 1024) JPEGs, one process on one thread
(torch.set_num_threads(1)), images/s of:
- test: load_image + the test transform (resize, centre crop), what index builds, evaluation and
  queries do; the peer is the same without draft decoding;
- train: load_image + RandomResizedCrop(scale 0.16-1) + flip + to tensor, the training path.
Goal (issue 27): 500 img/s per core for CUB-size and 250 for SOP-size at 224 px, so that 16
cores feed ~5,000 img/s. A script, not a test; the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from nearsight.index.images import load_image
from nearsight.models.preprocess import test_transform
from nearsight.models.spec import default_resize
from nearsight.training.data import train_min_side, train_transform

SIZES = {"cub": (640, 427), "sop": (1536, 1024)}


def make_jpegs(folder: Path, size: tuple[int, int], count: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for number in range(count):
        coarse = rng.integers(0, 255, (size[1] // 16, size[0] // 16, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)
        noise = rng.integers(-12, 12, (size[1], size[0], 3))
        pixels = np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
        path = folder / f"{number:04d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def rate(paths: list[Path], step) -> float:
    for path in paths[:5]:
        step(path)  # warm-up
    start = time.perf_counter()
    for path in paths:
        step(path)
    return len(paths) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = args.image_size
    resize = default_resize(size)
    test = test_transform(size)
    train = train_transform(size, [0.16, 1.0], True)
    train_side = train_min_side(size, [0.16, 1.0])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in SIZES.items():
            folder = Path(tmp) / name
            folder.mkdir()
            paths = make_jpegs(folder, dims, args.images)
            row = {
                "test_full": rate(paths, lambda p: test(load_image(p))),
                "test_draft": rate(paths, lambda p: test(load_image(p, resize))),
                "train_full": rate(paths, lambda p: train(load_image(p))),
                "train_draft": rate(paths, lambda p: train(load_image(p, train_side))),
            }
            results[name] = row
            print(f"{name} {dims[0]}x{dims[1]} at {size} px, img/s on one core: "
                  + ", ".join(f"{key} {value:.0f}" for key, value in row.items()))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
