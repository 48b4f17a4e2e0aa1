"""Decoding at the speed of the hardware (issue 27): JPEGs through TurboJPEG with Pillow's
pixels exactly, a training crop drawn before decoding (so a large JPEG is decoded at the scale
the crop allows), the same random draws as torchvision's transforms, and Adam's fused step."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.transforms import v2

from nearsight.data.images import load_image, load_image_bytes, load_image_pixels
from nearsight.training.augment import RandomCropDecode


def _photo(size: tuple[int, int], seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 255, (size[1] // 32 + 1, size[0] // 32 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)
    noise = rng.integers(-6, 6, (size[1], size[0], 3))
    return Image.fromarray(np.clip(np.asarray(image, np.int16) + noise, 0, 255).astype(np.uint8))


def _jpeg_bytes(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90, **options)
    return buffer.getvalue()


def _pillow_pixels(data: bytes, draft: tuple[int, int] | None = None) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    if draft:
        image.draft("RGB", draft)
    return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("min_side", [None, 400, 200, 100])  # scales 1, 1/2, 1/4, 1/8
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_turbojpeg_gives_pillows_pixels_at_every_scale(min_side, mode):
    data = _jpeg_bytes(_photo((1200, 800)).convert(mode))
    ours = np.asarray(load_image_bytes(data, "p.jpg", min_side))
    request = None if min_side is None else (1200 * min_side // 800, min_side)
    assert ours.shape[:2] == {None: (800, 1200), 400: (400, 600), 200: (200, 300),
                              100: (100, 150)}[min_side]  # fmt: skip
    assert np.array_equal(ours, _pillow_pixels(data, request))


def test_progressive_cmyk_and_rotated_jpegs_load_as_pillow_loads_them(tmp_path):
    photo = _photo((300, 200), seed=1)
    progressive = _jpeg_bytes(photo, progressive=True)
    assert np.array_equal(np.asarray(load_image_bytes(progressive)), _pillow_pixels(progressive))
    cmyk = _jpeg_bytes(photo.convert("CMYK"))  # TurboJPEG's path is not taken: Pillow's is
    assert np.array_equal(np.asarray(load_image_bytes(cmyk)), _pillow_pixels(cmyk))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored on its side: shown turned a quarter clockwise
    path = tmp_path / "phone.jpg"
    path.write_bytes(_jpeg_bytes(photo, exif=exif.tobytes()))
    upright = load_image(path)
    expected = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    assert upright.size == (200, 300)
    assert np.array_equal(np.asarray(upright), np.asarray(expected))
    assert np.array_equal(load_image_pixels(path), np.asarray(upright))


def test_a_truncated_jpeg_is_still_a_one_line_error(tmp_path):
    from nearsight.data.images import ImageLoadError

    path = tmp_path / "cut.jpg"
    path.write_bytes(_jpeg_bytes(_photo((300, 200)))[:2000])
    with pytest.raises(ImageLoadError, match="cut.jpg: .*truncated"):
        load_image(path)
    with pytest.raises(ImageLoadError, match="cut.jpg"):
        load_image_pixels(path)


def _augment(transform, load, seed: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return transform(load)


@pytest.mark.parametrize("seed", range(6))
def test_the_training_crop_matches_torchvisions_transforms_on_uint8(seed):
    """Decoded whole (a PNG), the crop, its resize and the flip are torchvision's own."""
    pixels = np.array(_photo((160, 120), seed))
    ours = _augment(RandomCropDecode(48, [0.16, 1.0], True), lambda _: pixels, seed)
    reference = v2.Compose([v2.RandomResizedCrop(48, scale=(0.16, 1.0), antialias=True),
                            v2.RandomHorizontalFlip()])  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        expected = reference(torch.from_numpy(pixels.copy()).permute(2, 0, 1))
    assert ours.dtype == torch.uint8 and ours.shape == (3, 48, 48)
    assert torch.equal(ours, expected)


def test_a_large_jpeg_is_decoded_at_the_scale_its_crop_allows(tmp_path):
    path = tmp_path / "product.jpg"
    path.write_bytes(_jpeg_bytes(_photo((1536, 1024), seed=3)))
    transform = RandomCropDecode(64, [0.5, 1.0], False)
    decoded: list[tuple[int, int]] = []

    def load(min_side):
        pixels = load_image_pixels(path, min_side)
        decoded.append(pixels.shape[:2])
        return pixels

    whole = load_image_pixels(path)
    for seed in range(8):
        drafted = _augment(transform, load, seed).float()
        same = _augment(transform, lambda _: whole, seed).float()
        other = _augment(transform, lambda _: whole, seed + 100).float()
        # the same crop of the same photo (only the decoding scale, and the crop's edges by
        # under a drafted pixel, differ) is far closer than another crop: 3-8 levels against 56+
        same_gap, other_gap = (drafted - same).abs().mean(), (drafted - other).abs().mean()
        assert same_gap < other_gap / 4, (seed, float(same_gap), float(other_gap))
    # crops of half the area or more keep 64 px at 1/4 or 1/8 of 1024 x 1536
    assert all(height <= 256 for height, _ in decoded)


def test_crops_are_drawn_on_the_upright_image(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 8
    path = tmp_path / "portrait.jpg"
    path.write_bytes(_jpeg_bytes(_photo((1600, 800), seed=4), exif=exif.tobytes()))
    sizes = []

    def load(min_side):
        def spy(width, height):
            sizes.append((width, height))
            return min_side(width, height)

        return load_image_pixels(path, spy)

    out = _augment(RandomCropDecode(32, [0.9, 1.0], False), load, 0)
    assert sizes == [(800, 1600)] and out.shape == (3, 32, 32)


def test_adam_takes_the_fused_step_with_the_same_update():
    from nearsight.training.builders import fused_adam

    torch.manual_seed(0)
    weights = [torch.randn(64, 32), torch.randn(32)]
    grads = [torch.randn_like(w) for w in weights]
    updated = []
    for fused in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        torch.optim.AdamW(params, lr=1e-2, weight_decay=1e-4, fused=fused).step()
        updated.append(params)
    for foreach_param, fused_param in zip(*updated, strict=True):
        torch.testing.assert_close(foreach_param, fused_param)
    assert fused_adam([{"params": updated[1]}])
    assert not fused_adam([{"params": [torch.nn.Parameter(torch.zeros(2, dtype=torch.int64),
                                                          requires_grad=False)]}])  # fmt: skip
