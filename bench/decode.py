"""Decode + augment throughput per core, with and without JPEG draft decoding (issue 27).

    python bench/decode.py [--images 200] [--image-size 224] [--json FILE]

For CUB-size (640 x 427) and SOP-size (1536 x 1024) JPEGs, one process on one thread
(torch.set_num_threads(1)), images/s of:
- test: load_image + the test transform (resize, centre crop), what index builds, evaluation and
  queries do; the peer is the same without draft decoding;
- train: the training path, :class:`nearsight.training.augment.RandomCropDecode` (crop drawn
  before decoding, the JPEG decoded at the scale that crop allows, cut + resize + flip, uint8
  tensor) under the dataset's seeding; the peer decodes every pixel first (train_full).
- decode_floor: the JPEG decoded at 1/8 scale and nothing else, the least work any decoder
  does for the file (its entropy-coded bytes are all read whatever the scale): no pipeline on
  this file runs faster.
- query_in_process / query_box: an upload's bytes to the model's input array, one at a time,
  decoded in this process (what the server did before issue 39, and does with
  NEARSIGHT_TRUSTED_IMAGES=1) or in a warm decode box worker (nearsight.data.decode_box), timed
  in turn on each image (3 rounds; medians); box_overhead is their ratio of seconds an image
  (1.0: no cost), box_ms_added the difference.
- build_in_process / build_box: ``index build``'s decoding (embed_paths with a no-op model, two
  decoding threads) of the files, trusted or in a two-worker box, in turn, 3 times (medians);
  build_box_ratio: box / in process in seconds.
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

from nearsight.data import decode_box
from nearsight.data.embed import embed_paths
from nearsight.data.images import load_image, load_image_bytes, load_image_pixels
from nearsight.data.jpeg import decode_rgb
from nearsight.models.preprocess import fit_short_side, test_transform
from nearsight.models.spec import default_resize
from nearsight.training.augment import RandomCropDecode

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


def paired(paths: list[Path], first, second, rounds: int = 3) -> tuple[float, float]:
    """Median seconds an image of ``first`` and of ``second``, timed one after the other on
    each image (a load that changes during the run weighs on both alike)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for path in paths:
            for step, spent in zip((first, second), times, strict=True):
                start = time.perf_counter()
                step(path)
                spent.append(time.perf_counter() - start)
    return float(np.median(times[0])), float(np.median(times[1]))


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
    train = RandomCropDecode(size, [0.16, 1.0], True)

    def train_step(path: Path, draft: bool) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):  # as SeededTrainDataset does per image
            torch.default_generator.manual_seed(0)
            return train(lambda min_side: load_image_pixels(path, min_side if draft else None))

    def build_seconds(paths: list[Path], trusted: bool) -> float:
        decode_box.set_trusted(trusted)
        try:
            start = time.perf_counter()
            embed_paths(lambda x: x.reshape(len(x), -1)[:, :8], paths, image_size=size,
                        batch_size=32, workers=2, desc="bench")  # fmt: skip
            return time.perf_counter() - start
        finally:
            decode_box.set_trusted(None)

    results = {}
    box = decode_box.shared_box(2)
    assert box is not None
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in SIZES.items():
            folder = Path(tmp) / name
            folder.mkdir()
            paths = make_jpegs(folder, dims, args.images)
            row = {
                "test_full": rate(paths, lambda p: test(load_image(p))),
                "test_draft": rate(paths, lambda p: test(load_image(p, resize))),
                "train_full": rate(paths, lambda p: train_step(p, draft=False)),
                "train_draft": rate(paths, lambda p: train_step(p, draft=True)),
                "decode_floor": rate(paths, lambda p, wh=dims: decode_rgb(p.read_bytes(), *wh, 8)),
            }
            uploads = {path: path.read_bytes() for path in paths}
            in_process, boxed = paired(
                paths,
                lambda p, u=uploads: test(fit_short_side(load_image_bytes(u[p], p.name, resize),
                                                         resize)),
                lambda p, u=uploads: test(box.decode_bytes(u[p], p.name, resize).image),
            )  # fmt: skip
            row["query_in_process"], row["query_box"] = 1 / in_process, 1 / boxed
            row["box_overhead"] = boxed / in_process
            row["box_ms_added"] = 1000 * (boxed - in_process)
            build_seconds(paths[:10], False)  # warm the box's second worker
            builds = [(build_seconds(paths, True), build_seconds(paths, False)) for _ in range(3)]
            trusted = float(np.median([t for t, _ in builds]))
            boxed_build = float(np.median([b for _, b in builds]))
            row["build_in_process"] = len(paths) / trusted
            row["build_box"] = len(paths) / boxed_build
            row["build_box_ratio"] = boxed_build / trusted
            results[name] = row
            print(f"{name} {dims[0]}x{dims[1]} at {size} px, img/s on one core: "
                  + ", ".join(f"{key} {value:.3g}" for key, value in row.items()))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
