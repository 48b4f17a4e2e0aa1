"""The one image loader: odd formats become RGB, broken files become ImageLoadError."""

from __future__ import annotations

import hashlib
import io
import os
import warnings

import numpy as np
import pytest
from PIL import Image, ImageFile

from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.data import images, rgb
from nearsight.data.images import ImageLoadError, load_image, load_image_bytes


def _png_bytes(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **params)
    return buffer.getvalue()


def _jpeg_bytes(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95, **params)
    return buffer.getvalue()


def _assert_one_line_error(error: pytest.ExceptionInfo, name: str) -> str:
    message = str(error.value)
    assert isinstance(error.value, NearsightError)
    assert message.startswith(f"cannot read image {name}: ")
    assert "\n" not in message
    return message


def test_rgb_png_round_trips_exactly(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    path = tmp_path / "a.png"
    Image.fromarray(pixels).save(path)
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (7, 5)
    np.testing.assert_array_equal(np.asarray(image), pixels)


def test_exif_orientation_6_rotates_the_image(tmp_path):
    # A 40 wide x 20 high photo whose left half is red; orientation 6 means "rotate 90 degrees
    # clockwise to display": the result is 20 wide x 40 high with the red half on top.
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = (255, 0, 0)
    pixels[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    path.write_bytes(_jpeg_bytes(Image.fromarray(pixels), exif=exif.tobytes()))

    image = load_image(path)
    assert image.size == (20, 40)
    top, bottom = np.asarray(image)[5, 10], np.asarray(image)[35, 10]
    assert top[0] > 200 and top[2] < 60  # red
    assert bottom[2] > 200 and bottom[0] < 60  # blue


def test_16_bit_gradient_uses_the_full_8_bit_range():
    ramp = np.tile(np.linspace(0, 65535, 256).round().astype(np.uint16), (4, 1))
    source = Image.fromarray(ramp)
    assert source.mode == "I;16"
    image = load_image_bytes(_png_bytes(source))
    values = np.asarray(image)
    assert image.mode == "RGB"
    assert values.min() == 0 and values.max() == 255
    # Linear, not clipped: the middle of the ramp is mid-grey (Pillow's own convert gives 255).
    assert abs(int(values[0, 128, 0]) - 128) <= 1
    assert len(np.unique(values[..., 0])) > 250
    np.testing.assert_array_equal(values[..., 0], values[..., 2])


def test_32_bit_integer_and_float_images_are_scaled():
    sixteen_bit = Image.fromarray(np.array([[0, 32896, 65535]], dtype=np.int32))
    assert sixteen_bit.mode == "I"
    assert list(np.asarray(rgb.to_rgb(sixteen_bit))[0, :, 0]) == [0, 128, 255]
    unit_float = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32))
    assert unit_float.mode == "F"
    assert list(np.asarray(rgb.to_rgb(unit_float))[0, :, 0]) == [0, 128, 255]
    wide_float = Image.fromarray(np.array([[-10.0, 0.0, 10.0]], dtype=np.float32))
    assert list(np.asarray(rgb.to_rgb(wide_float))[0, :, 0]) == [0, 128, 255]


def test_cmyk_becomes_rgb():
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))  # no cyan/black, full magenta+yellow
    image = load_image_bytes(_jpeg_bytes(cmyk))
    red = np.asarray(image)[2, 2]
    assert image.mode == "RGB"
    assert red[0] > 230 and red[1] < 30 and red[2] < 30


def test_palette_transparency_is_composited_on_white():
    palette_image = Image.new("P", (4, 4), 1)
    palette_image.putpalette([0, 0, 0, 200, 30, 40] + [0] * 762)
    palette_image.putpixel((0, 0), 0)  # index 0 is the transparent one (and black)
    image = load_image_bytes(_png_bytes(palette_image, transparency=0))
    pixels = np.asarray(image)
    assert image.mode == "RGB"
    assert tuple(pixels[0, 0]) == (255, 255, 255)  # transparent -> white, not black
    assert tuple(pixels[1, 1]) == (200, 30, 40)


def test_gray_alpha_is_composited_on_white():
    la = np.zeros((2, 2, 2), np.uint8)
    la[..., 0] = 0  # black ...
    la[0, 0, 1] = 0  # ... fully transparent
    la[0, 1, 1] = 255  # ... opaque
    la[1, 0, 1] = 128  # ... half transparent
    image = load_image_bytes(_png_bytes(Image.fromarray(la, mode="LA")))
    pixels = np.asarray(image)[..., 0]
    assert image.mode == "RGB"
    assert pixels[0, 0] == 255 and pixels[0, 1] == 0
    assert abs(int(pixels[1, 0]) - 127) <= 1


def test_rgba_and_grayscale_and_bilevel(tmp_path):
    rgba = Image.new("RGBA", (3, 3), (10, 20, 30, 0))
    assert tuple(np.asarray(load_image_bytes(_png_bytes(rgba)))[1, 1]) == (255, 255, 255)
    gray = Image.new("L", (3, 3), 77)
    assert tuple(np.asarray(load_image_bytes(_png_bytes(gray)))[1, 1]) == (77, 77, 77)
    bilevel = Image.new("1", (3, 3), 1)
    assert tuple(np.asarray(load_image_bytes(_png_bytes(bilevel)))[1, 1]) == (255, 255, 255)


def test_truncated_jpeg_is_an_image_load_error(tmp_path):
    noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = _jpeg_bytes(Image.fromarray(noise))
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageLoadError) as error:
        load_image(path)
    assert "truncated" in _assert_one_line_error(error, str(path))
    assert error.value.path == str(path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(np.random.default_rng(2).bytes(1000), "not an image"), (b"", "empty")],
    ids=["random-bytes", "empty"],
)
def test_garbage_and_empty_files(tmp_path, content, reason):
    path = tmp_path / "bad.png"
    path.write_bytes(content)
    with pytest.raises(ImageLoadError) as error:
        load_image(path)
    assert reason in _assert_one_line_error(error, str(path))


def test_garbage_bytes_upload_names_the_upload():
    with pytest.raises(ImageLoadError) as error:
        load_image_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, name="query.png")
    _assert_one_line_error(error, "query.png")


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(ImageLoadError) as error:
        load_image(tmp_path / "nope.jpg")
    assert "no such file" in _assert_one_line_error(error, str(tmp_path / "nope.jpg"))
    with pytest.raises(ImageLoadError) as error:
        load_image(tmp_path)
    assert "folder" in _assert_one_line_error(error, str(tmp_path))


def test_decompression_bomb_limit(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    Image.new("RGB", (100, 100)).save(path)
    monkeypatch.setattr(images, "MAX_PIXELS", 9_999)
    with pytest.raises(ImageLoadError) as error:
        load_image(path)
    assert "decompression bomb" in _assert_one_line_error(error, str(path))
    monkeypatch.setattr(images, "MAX_PIXELS", 10_000)
    assert load_image(path).size == (100, 100)


def test_the_decode_budget_counts_bytes_and_is_checked_before_decoding(monkeypatch):
    """The estimate (issue 33): 8 bytes a pixel for any mode (the decoded buffer and its RGB,
    converted band by band), at the drafted size, plus a progressive JPEG's full-size DCT
    coefficients; over MAX_DECODE_BYTES an image is refused before a pixel is decoded."""
    assert rgb.decoded_bytes("I;16", 1000, 1000) == 8_000_000
    assert rgb.decoded_bytes("F", 1000, 1000) == rgb.decoded_bytes("RGB", 1000, 1000)
    assert rgb.decoded_bytes("RGB", 8000, 8000, scale=8) == 1000 * 1000 * 8
    assert rgb.decoded_bytes("RGB", 8000, 8000, scale=8, coefficients=3) == 8_000_000 + 384_000_000
    sixteen = _png_bytes(Image.fromarray(np.zeros((400, 400), np.uint16)))  # 1.28 MB to decode
    progressive = _jpeg_bytes(Image.new("RGB", (400, 400)), progressive=True)  # 2.24 MB
    monkeypatch.setattr(images, "MAX_DECODE_BYTES", 2 << 20)
    assert load_image_bytes(sixteen).size == (400, 400)
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self))
    monkeypatch.setattr(images, "decode_rgb", lambda *args: decoded.append(args))
    with pytest.raises(ImageLoadError) as error:
        load_image_bytes(progressive, "p.jpg")
    message = _assert_one_line_error(error, "p.jpg")
    assert "about 2 MB, more than the limit of 2 MB" in message and decoded == []
    monkeypatch.setattr(images, "MAX_DECODE_BYTES", 1 << 20)
    with pytest.raises(ImageLoadError, match="400x400 I;16 pixels would take about 1 MB"):
        load_image_bytes(sixteen)
    assert decoded == []


def test_16_bit_and_float_images_convert_band_by_band_as_on_the_whole_image():
    """The banded conversion gives the pixels a whole-image one gives (several bands here)."""
    values = np.random.default_rng(3).integers(0, 65535, (1200, 2000)).astype(np.uint16)
    whole = np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8)
    banded = np.asarray(rgb.to_rgb(Image.fromarray(values)))
    np.testing.assert_array_equal(banded[..., 0], whole)
    floats = (values.astype(np.float32) - 30000) / 7.0  # stretched min..max
    low, high = float(floats.min()), float(floats.max())
    stretched = (floats.astype(np.float64) - low) * (255.0 / (high - low))
    banded = np.asarray(rgb.to_rgb(Image.fromarray(floats)))
    np.testing.assert_array_equal(
        banded[..., 1], np.clip(np.rint(stretched), 0, 255).astype(np.uint8)
    )


@pytest.mark.parametrize("pil_limit", [6_000, 4_000], ids=["pil-warning", "pil-error"])
def test_pillow_bomb_warning_and_error_become_image_load_errors(tmp_path, monkeypatch, pil_limit):
    # Pillow warns above MAX_IMAGE_PIXELS and raises above twice that: both are our error, and
    # the warnings filter is back as it was afterwards.
    path = tmp_path / "big.png"
    Image.new("RGB", (100, 100)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", pil_limit)
    filters_before = list(warnings.filters)
    with pytest.raises(ImageLoadError) as error:
        load_image(path)
    _assert_one_line_error(error, str(path))
    assert warnings.filters == filters_before


def test_file_sha256(tmp_path):
    path = tmp_path / "data.bin"
    content = os.urandom(3 * 1024 * 1024 + 7)
    path.write_bytes(content)
    assert file_sha256(path) == hashlib.sha256(content).hexdigest()
    with pytest.raises(NearsightError, match="cannot read file"):
        file_sha256(tmp_path / "missing.bin")
