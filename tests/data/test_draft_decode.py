"""JPEG draft decoding (issue 27): a large JPEG is decoded at 1/2, 1/4 or 1/8 scale when the
target size allows it, and every path that embeds for a gallery (build, CLI search, the Python
API, REST and the page) decodes the same way, so a query equal to a gallery file still lands at
distance 0."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from helpers import ONNX_CLASSES, run, running_page
from PIL import Image

from nearsight.data.images import draft_request, load_image, load_image_bytes
from nearsight.models.spec import default_resize
from nearsight.training.data import train_min_side


def _jpeg(path, size=(1536, 1024), seed=0):
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (size[1] // 64, size[0] // 64, 3), dtype=np.uint8)
    Image.fromarray(small).resize(size, Image.Resampling.BICUBIC).save(path, quality=90)
    return path


def test_the_draft_request_keeps_the_short_side_the_caller_needs():
    assert draft_request(1536, 1024, None) is None
    assert draft_request(640, 427, 256) is None  # less than half the pixels would go
    assert draft_request(1536, 1024, 256) == (384, 256)
    assert draft_request(1024, 1536, lambda w, h: 300) == (300, 450)


def test_a_large_jpeg_decodes_at_the_smallest_scale_that_keeps_the_short_side(tmp_path):
    path = _jpeg(tmp_path / "product.jpg")
    assert load_image(path).size == (1536, 1024)
    assert load_image(path, 256).size == (384, 256)  # 1/4: 256 >= 256
    assert load_image(path, 300).size == (768, 512)  # 1/2: 1/4 would leave 256 < 300
    assert load_image_bytes(path.read_bytes(), "p.jpg", 256).size == (384, 256)
    png = tmp_path / "same.png"
    Image.open(path).save(png)
    assert load_image(png, 256).size == (1536, 1024)  # only JPEGs have a draft mode


def test_a_cached_training_image_keeps_the_pixels_of_its_smallest_crop():
    """data.cache_images decodes once for every later crop: drafted only where the smallest
    crop keeps its pixels (uncached, each crop picks its own scale: test_fast_decode.py)."""
    cub = train_min_side(224, [0.16, 1.0])(500, 375)
    assert cub > 375 // 2  # CUB-size images are decoded whole at 224 px
    loose = train_min_side(64, [0.5, 1.0])(1536, 1024)
    assert draft_request(1536, 1024, lambda w, h: loose) is not None  # 64 px training: drafted


@pytest.fixture(scope="module")
def jpeg_gallery(tmp_path_factory, onnx_gallery):
    """The ONNX test model's gallery of 640 x 480 JPEGs (drafted to 1/8 for its 32 px input)."""
    root = tmp_path_factory.mktemp("jpeg")
    data = root / "data"
    for label in range(ONNX_CLASSES):
        folder = data / f"class_{label}"
        folder.mkdir(parents=True)
        for number in range(3):
            _jpeg(folder / f"{number}.jpg", size=(640, 480), seed=10 * label + number)
    gallery = root / "gallery"
    from nearsight.app.cli import main

    argv = ["index", "build", "--model", onnx_gallery.model, "--dataset", "folder", "--root",
            data, "--split", "all", "--out", gallery, "--workers", "0"]  # fmt: skip
    assert main([str(arg) for arg in argv]) == 0
    assert default_resize(32) * 2 <= 480  # the build drafted
    return gallery, sorted(data.rglob("*.jpg"))


def test_a_gallery_jpeg_queried_by_the_cli_the_api_and_rest_lands_at_distance_0(
    jpeg_gallery, capsys
):
    import nearsight

    gallery, images = jpeg_gallery
    query = images[4]
    code, out, err = run(capsys, "search", "--gallery", gallery, query, "--k", "1", "--json")
    assert code == 0, err
    first = json.loads(out)[0]
    assert first["path"] == str(query) and first["distance"] < 1e-5
    with nearsight.open_gallery(gallery) as opened:
        (hit,) = opened.search(query, k=1)
    assert hit["distance"] < 1e-5
    with running_page([gallery]) as (url, _demo):
        files = {"image": (query.name, query.read_bytes(), "image/jpeg")}
        reply = httpx.post(f"{url.rstrip('/')}/api/search", files=files, data={"k": 1})
    top = reply.json()["neighbours"][0]
    assert str(query).endswith(top["path"]) and top["distance"] < 1e-5
