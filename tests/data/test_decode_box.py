"""The decode box (nearsight/data/decode_box.py): untrusted images decoded in worker processes
under an address-space and a wall-time limit, with only the fitted pixels coming back. Real
worker processes, real Pillow, real tag bombs (tests/helpers/bombs.py)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import jpeg_scan_bomb, tag_bomb
from PIL import Image

from nearsight.data import decode_box
from nearsight.data.decode_box import DecodeBox
from nearsight.data.embed import embed_paths
from nearsight.data.images import ImageLoadError, load_image_bytes
from nearsight.models import preprocess


@pytest.fixture(scope="module")
def box():
    with DecodeBox(1) as opened:
        yield opened


def _photo(size=(300, 200), orientation: int | None = None, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(sum(size))
    coarse = rng.integers(0, 255, (size[1] // 10, size[0] // 10, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(out, format=fmt, exif=exif.tobytes())
    return out.getvalue()


@pytest.mark.parametrize(
    "size, orientation, fmt",
    [((300, 200), None, "JPEG"), ((300, 200), 6, "JPEG"), ((40, 900), 8, "PNG"),
     ((1200, 700), None, "JPEG"), ((3, 5), None, "WEBP")],
)  # fmt: skip
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_the_box_gives_the_pixels_the_model_would_get_in_process(box, size, orientation, fmt,
                                                                 interpolation):  # fmt: skip
    """What comes back, through the test transform, is the in-process path's array exactly
    (JPEG draft scale, EXIF orientation, the aspect cut and the resize are all the same)."""
    data = _photo(size, orientation, fmt)
    fitted = box.decode_bytes(data, "photo", 64, interpolation)
    transform = preprocess.test_transform(56, 64, interpolation)
    expected = transform(load_image_bytes(data, "photo", 64))
    np.testing.assert_array_equal(transform(fitted.image), expected)
    assert min(fitted.image.size) == 64
    assert fitted.loaded_size == load_image_bytes(data, "photo").size  # upright, full size


@pytest.mark.parametrize("trusted", [False, True])
def test_meanwhile_runs_once_in_the_callers_thread_beside_the_decoding(trusted):
    calls = []
    with decode_box.trusting(trusted):
        fitted = decode_box.fit_bytes(
            _photo(), "photo.jpg", 32, meanwhile=lambda: calls.append(threading.current_thread())
        )
    assert calls == [threading.current_thread()] and min(fitted.image.size) == 32


def test_a_file_path_is_read_and_decoded_by_the_worker(box, tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(_photo((320, 240), 6))
    fitted = box.decode_file(path, 64)
    assert fitted.loaded_size == (240, 320)
    with pytest.raises(ImageLoadError, match=r"cannot read image .*missing\.jpg: no such file"):
        box.decode_file(tmp_path / "missing.jpg", 64)


@pytest.mark.parametrize("kind", ["tiff", "png", "webp"])
def test_a_file_whose_64535_tags_repeat_9_mb_is_refused_and_its_worker_replaced(kind):
    """The 10 MB file whose tags ask Pillow for ~550 GiB of copies: its worker reaches its
    address-space limit, the image gets one line naming the limit, the worker is replaced,
    and the next image decodes. (In process it grew until the machine ran out.)"""
    data = tag_bomb(kind, 64535, 9_000_000)
    assert len(data) < 10 * 2**20
    with DecodeBox(1, memory_mb=400) as box:
        with pytest.raises(ImageLoadError) as refused:
            box.decode_bytes(data, "bomb." + kind, 64)
        message = str(refused.value)
        assert "\n" not in message and "bomb." + kind in message
        assert "limit of 400 MB" in message
        assert box.replaced == 1 and box.workers == 1
        assert box.decode_bytes(_photo(), "next.jpg", 64).image.size == (96, 64)


def test_a_jpeg_exif_bomb_is_decoded_within_the_limit(box):
    """A JPEG's EXIF segment holds 64 KB: 5,400 tags pointing at it ask ~350 MB, which a
    worker may spend; the image comes back (it is a valid 1x1 image)."""
    fitted = box.decode_bytes(tag_bomb("jpeg", 5400, 0), "bomb.jpg", 64)
    assert fitted.loaded_size == (1, 1)


def test_a_late_worker_is_killed_and_replaced():
    """A decode past the time limit: the image gets one line naming the limit, its worker is
    killed (not left decoding), a fresh one serves the next image."""
    plane = np.random.default_rng(0).integers(0, 255, (3000, 3000), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(plane).save(out, format="PNG", compress_level=1)  # ~9 MB, tens of ms
    with DecodeBox(1, timeout_s=60) as box:
        box.decode_bytes(_photo(), "warm.jpg", 64)  # started: the wait for it counts too
        box.timeout_s = 0.001
        old = next(iter(box._pool._all)).process
        with pytest.raises(ImageLoadError, match=r"longer than the limit of 0\.001 s"):
            box.decode_bytes(out.getvalue(), "slow.png", 64)
        assert old.poll() == -signal.SIGKILL
        assert box.replaced == 1
        box.timeout_s = 60.0
        assert box.decode_bytes(_photo(), "next.jpg", 64).image.size == (96, 64)


def test_a_worker_killed_while_idle_is_replaced_before_it_is_used():
    with DecodeBox(1) as box:
        box.decode_bytes(_photo(), "warm.jpg", 64)
        worker = next(iter(box._pool._all)).process
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert box.decode_bytes(_photo(), "next.jpg", 64).image.size == (96, 64)
        assert box.replaced == 1


def test_an_unreadable_file_is_one_line_and_keeps_its_worker(box):
    before = box.replaced
    with pytest.raises(ImageLoadError, match=r"^cannot read image x\.png: not an image file"):
        box.decode_bytes(b"\x89PNG not really", "x.png", 64)
    with pytest.raises(ImageLoadError, match="the file is empty"):
        box.decode_bytes(b"", "empty.png", 64)
    assert box.replaced == before


def test_a_build_skips_and_names_a_bomb_among_good_files(tmp_path):
    """embed_paths (index build / add, search --queries): the bomb is one skipped file named
    in the errors, the good ones are embedded with their loaded sizes."""
    good = [tmp_path / f"{n}.jpg" for n in range(3)]
    for n, path in enumerate(good):
        path.write_bytes(_photo((200 + 10 * n, 150)))
    bomb = tmp_path / "bomb.tif"
    bomb.write_bytes(tag_bomb("tiff", 64535, 9_000_000))
    paths = [good[0], bomb, good[1], good[2]]
    result = embed_paths(lambda x: x.reshape(len(x), -1)[:, :4], paths, image_size=32,
                         batch_size=2, workers=2)  # fmt: skip
    assert result.ok.tolist() == [True, False, True, True]
    assert len(result.errors) == 1 and str(bomb) in result.errors[0]
    assert "limit of" in result.errors[0] and "MB of memory" in result.errors[0]
    assert result.sizes == [(200, 150), (210, 150), (220, 150)]
    with decode_box.trusting(True):  # the operator's own folder: decoded in process
        trusted = embed_paths(lambda x: x.reshape(len(x), -1)[:, :4], [good[0], good[1]],
                              image_size=32, batch_size=2)  # fmt: skip
    assert not decode_box.trusted()
    np.testing.assert_array_equal(trusted.embeddings, result.embeddings[:2])


def test_lossless_webp_is_counted_at_what_its_decoding_really_holds(tmp_path):
    """The decode budget's estimate for a WebP covers the peak its decoding really reaches (in
    a fresh process: VmHWM before and after); it once counted 8 bytes a pixel, about half."""
    path = tmp_path / "big.webp"
    pixels = np.zeros((2000, 2000, 3), np.uint8)
    pixels[::3, ::5] = 200
    Image.fromarray(pixels).save(path, format="WEBP", lossless=True)
    probe = textwrap.dedent(f"""
        from pathlib import Path
        from PIL import Image
        from nearsight.data.images import load_image_bytes
        from nearsight.data.rgb import decoded_bytes
        data = Path({str(path)!r}).read_bytes()
        with Image.open({str(path)!r}) as image:
            estimate = decoded_bytes(image.mode, *image.size, format=image.format)
        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        before = hwm()
        load_image_bytes(data, "big.webp")
        print(hwm() - before, estimate)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, check=True).stdout.split()  # fmt: skip
    used, estimate = int(out[0]), int(out[1])
    print(f"decoding used {used / 4e6:.1f} B/px, counted {estimate / 4e6:.1f}")
    assert used <= estimate


def test_shared_box_is_none_where_images_are_trusted(monkeypatch):
    monkeypatch.setenv(decode_box.TRUSTED_ENV, "1")
    assert decode_box.shared_box() is None
    fitted = decode_box.fit_bytes(_photo(), "photo.jpg", 64)  # in process
    assert fitted.image.size == (96, 64) and fitted.loaded_size == (300, 200)


def test_serve_shows_the_box_defaults_it_uses():
    from nearsight.app.serve.settings import Settings

    assert Settings().decode_memory_mb == decode_box.DEFAULT_MEMORY_MB
    assert Settings().decode_timeout == decode_box.DEFAULT_TIMEOUT_S


def test_a_jpeg_of_thousands_of_scans_is_refused_before_decoding():
    """A ~500 KB progressive 6000 x 6000 JPEG whose flat AC scan repeats 6,000 times: about a
    minute of CPU in process (each repeat visits every block). The box counts its scans
    before decoding and refuses it in one line; its worker serves the next image."""
    data = jpeg_scan_bomb(6000, 6000)
    with DecodeBox(1, timeout_s=2) as box:
        box.decode_bytes(_photo(), "warm.jpg", 64)  # the worker has started
        start = time.monotonic()
        with pytest.raises(ImageLoadError, match=r"scans\.jpg: a JPEG of 6\d\d\d scans"):
            box.decode_bytes(data, "scans.jpg", 64)
        assert time.monotonic() - start < 20
        assert box.replaced == 0
        assert box.decode_bytes(_photo(), "next.jpg", 64).image.size == (96, 64)
