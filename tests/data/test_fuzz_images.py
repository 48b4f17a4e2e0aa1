"""Fuzzing the one image loader (data.images) with mutated image files: whatever the bytes,
load_image_bytes and load_image either return a fully decoded RGB image that the shared test
transform turns into a [3, 224, 224] tensor in [0, 1], or raise ImageLoadError with one line
naming the file. Nothing else may escape, and no example may hang.

Seeds: small JPEGs (baseline; progressive with an EXIF orientation) and PNGs (RGB, RGBA,
palette with transparency, 16-bit grey), and in a second test GIF, BMP, TIFF (raw and LZW),
WebP and ICO, since the loader takes any format Pillow reads. Mutations: set a byte, cut the
file, insert, delete or duplicate a run of bytes, write a 32-bit integer (sizes, lengths,
offsets: 0, 1, 65535, 2^31-1, ...). For PNG the chunk CRCs are optionally recomputed after
mutating, so that a mutated IHDR (width, height, bit depth, colour type) reaches the decoder
instead of failing its checksum.
"""

from __future__ import annotations

import io
import signal
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from nearsight.data.images import ImageLoadError, load_image, load_image_bytes
from nearsight.models.preprocess import test_transform as make_test_transform

EXAMPLES = 250  # ~3 ms each here; the whole file runs in a few seconds
DEADLINE = timedelta(seconds=5)  # per example (hypothesis reports slower ones)
HANG_S = 30  # per example, hard: SIGALRM turns a hang into a failure
NAME = "fuzzed.img"

pytestmark = [
    # Pillow warns about corrupt EXIF/TIFF tags while it recovers; that is not a failure
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def _encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def _seeds() -> tuple[dict[str, bytes], dict[str, bytes]]:
    pixels = np.random.default_rng(0).integers(0, 256, (24, 32, 3), np.uint8)
    rgb = Image.fromarray(pixels)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the loader applies it
    grey16 = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)
    main = {
        "jpeg": _encode(rgb, "JPEG", quality=90),
        "jpeg-progressive-exif": _encode(
            rgb, "JPEG", quality=80, progressive=True, exif=exif.tobytes()
        ),
        "png": _encode(rgb, "PNG"),
        "png-rgba": _encode(rgb.convert("RGBA"), "PNG"),
        "png-palette-trns": _encode(rgb.convert("P"), "PNG", transparency=3),
        "png-16bit": _encode(grey16, "PNG"),
    }
    other = {
        "gif": _encode(rgb.convert("P"), "GIF"),
        "bmp": _encode(rgb, "BMP"),
        "tiff": _encode(rgb, "TIFF"),
        "tiff-lzw": _encode(rgb, "TIFF", compression="tiff_lzw"),
        "webp": _encode(rgb, "WEBP"),
        "ico": _encode(rgb, "ICO"),
    }
    return main, other


JPEG_PNG_SEEDS, OTHER_SEEDS = _seeds()
_NUMPY_TRANSFORM = make_test_transform(224)  # what every image goes through next (default size)


def TRANSFORM(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(_NUMPY_TRANSFORM(image))


mutations = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 2**20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 2**20), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 2**20), st.integers(1, 64)),
    st.tuples(st.just("duplicate"), st.integers(0, 2**20), st.integers(1, 64)),
    st.tuples(
        st.just("int32"),
        st.integers(0, 2**20),
        st.sampled_from([0, 1, 255, 65535, 65536, 2**31 - 1, 2**32 - 1]),
    ),
)


def mutate(data: bytes, steps: list[tuple]) -> bytes:
    out = bytearray(data)
    for kind, position, value in steps:
        if not out:
            break
        at = position % len(out)
        if kind == "set":
            out[at] = value
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = value
        elif kind == "delete":
            del out[at : at + value]
        elif kind == "duplicate":
            out[at:at] = out[at : at + value]
        elif kind == "int32" and at + 4 <= len(out):
            out[at : at + 4] = struct.pack(">I", value)
    return bytes(out)


def fix_png_crcs(data: bytes) -> bytes:
    """Recompute each PNG chunk's CRC (as far as the chunk structure still parses)."""
    out, at = bytearray(data[:8]), 8
    while at + 12 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        end = at + 12 + length
        if end > len(data):
            break
        kind, body = data[at + 4 : at + 8], data[at + 8 : end - 4]
        out += data[at : at + 8] + body + struct.pack(">I", zlib.crc32(kind + body))
        at = end
    return bytes(out + data[at:])


class Hang(Exception):
    pass


@contextmanager
def hang_guard(seconds: float) -> Iterator[None]:
    def expire(signum, frame):
        raise Hang(f"an image took more than {seconds}s to load")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_outcome(load) -> str:
    """Run ``load``; an RGB image must go through the test transform. 'ok' or 'refused'."""
    with hang_guard(HANG_S):
        try:
            image = load()
        except ImageLoadError as error:
            message = str(error)
            assert "\n" not in message
            assert message.startswith("cannot read image ") and NAME in message, message
            return "refused"
        assert isinstance(image, Image.Image) and image.mode == "RGB"
        assert image.width > 0 and image.height > 0
        tensor = TRANSFORM(image)
    assert tensor.shape == (3, 224, 224) and tensor.dtype == torch.float32
    assert torch.isfinite(tensor).all() and tensor.min() >= 0.0 and tensor.max() <= 1.0
    return "ok"


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=DEADLINE,
    database=None,  # no .hypothesis folder written by CI
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def outcomes() -> dict[str, int]:
    """Counts of the outcomes, per seed format (printed at the end: docs/reliability.md's numbers)."""
    counts: dict[str, int] = {}
    yield counts
    print("\nfuzz outcomes:", dict(sorted(counts.items())))


@FUZZ_SETTINGS
@given(
    seed=st.sampled_from(sorted(JPEG_PNG_SEEDS)),
    steps=st.lists(mutations, min_size=1, max_size=4),
    fix_crcs=st.booleans(),
)
def test_mutated_jpeg_and_png_bytes_load_or_are_refused(outcomes, seed, steps, fix_crcs):
    data = mutate(JPEG_PNG_SEEDS[seed], steps)
    if fix_crcs and seed.startswith("png"):
        data = fix_png_crcs(data)
    result = check_outcome(lambda: load_image_bytes(data, name=NAME))
    outcomes[f"{seed}:{result}"] = outcomes.get(f"{seed}:{result}", 0) + 1


@FUZZ_SETTINGS
@given(
    seed=st.sampled_from(sorted(JPEG_PNG_SEEDS)),
    steps=st.lists(mutations, min_size=1, max_size=3),
)
def test_mutated_files_load_or_are_refused(tmp_path_factory, seed, steps):
    path = tmp_path_factory.getbasetemp() / NAME
    path.write_bytes(mutate(JPEG_PNG_SEEDS[seed], steps))
    check_outcome(lambda: load_image(path))


@settings(FUZZ_SETTINGS, max_examples=150)
@given(
    seed=st.sampled_from(sorted(OTHER_SEEDS)),
    steps=st.lists(mutations, min_size=1, max_size=4),
)
def test_mutated_gif_bmp_tiff_webp_ico_load_or_are_refused(outcomes, seed, steps):
    result = check_outcome(lambda: load_image_bytes(mutate(OTHER_SEEDS[seed], steps), name=NAME))
    outcomes[f"{seed}:{result}"] = outcomes.get(f"{seed}:{result}", 0) + 1


def test_the_seeds_themselves_load():
    for name, data in {**JPEG_PNG_SEEDS, **OTHER_SEEDS}.items():
        assert check_outcome(lambda data=data: load_image_bytes(data, name=NAME)) == "ok", name


def test_a_png_with_a_mutated_header_is_a_bomb_or_an_error_not_a_crash():
    """The CRC fix-up does reach the decoder: a 100000 x 100000 IHDR is refused as a bomb."""
    seed = JPEG_PNG_SEEDS["png"]
    width_at = 8 + 8  # signature, IHDR length and type
    data = fix_png_crcs(
        mutate(seed, [("int32", width_at, 100_000), ("int32", width_at + 4, 100_000)])
    )
    with pytest.raises(ImageLoadError, match="decompression bomb"):
        load_image_bytes(data, name=NAME)


@pytest.mark.parametrize("size", [(2_000, 1), (1, 2_000), (1_000, 3)])
def test_extreme_aspect_ratios_stay_small_in_the_transform(size, monkeypatch):
    """A 1 x 20000 PNG is ~150 bytes; resizing its short side to 256 used to ask for a
    256 x 5.1M image (4 GB) before the centre crop (1 x 1000000: 200 GB). The long side is cut
    first now. (Small sizes here, so that a regression costs 400 MB, not an OOM kill.)"""
    from nearsight.models import preprocess

    resized: list[tuple[int, int]] = []
    original = preprocess.resize_short_side

    def recording_resize(image, *args, **kwargs):
        out = original(image, *args, **kwargs)
        resized.append(out.size)
        return out

    monkeypatch.setattr(preprocess, "resize_short_side", recording_resize)
    data = _encode(Image.new("RGB", size, (200, 30, 30)), "PNG")
    assert len(data) < 20_000
    tensor = TRANSFORM(load_image_bytes(data, name=NAME))
    assert tensor.shape == (3, 224, 224)
    torch.testing.assert_close(tensor[:, 112, 112], torch.tensor([200, 30, 30]) / 255.0)
    assert resized and max(resized[0]) <= 16 * 256  # 16:1 at most, short side 256


def test_ordinary_aspect_ratios_are_transformed_as_before():
    """Up to 16:1 the transform is exactly resize-then-centre-crop (galleries built before the
    extreme-ratio cut embed the same)."""
    from torchvision.transforms import InterpolationMode, functional

    pixels = np.random.default_rng(3).integers(0, 256, (40, 640, 3), np.uint8)  # 16:1
    for image in (Image.fromarray(pixels), Image.fromarray(pixels[:, :90])):
        expected = functional.center_crop(
            functional.resize(image, 256, InterpolationMode.BILINEAR, antialias=True), [224, 224]
        )
        expected = functional.pil_to_tensor(expected).float().div_(255.0)
        torch.testing.assert_close(TRANSFORM(image), expected, rtol=0, atol=0)
