"""The decode box under the server (issue 51, items 2, 9 and 10): a JPEG of more scans than an
encoder writes is refused before decoding; a worker killed while idle is not blamed on the
next image; only regular files are opened, without blocking.

Before: two clients looping a JPEG of 6,000 scans kept both workers busy for their 30 s;
after a worker was SIGKILLed while idle the next valid upload got 415 ("over the memory limit,
or a corrupt file") 8 times in 20; a manifest path /dev/stdin held a worker for 30 s."""

from __future__ import annotations

import io
import os
import signal

import pytest
from helpers import jpeg_scan_bomb
from PIL import Image

from nearsight.data.decode_box import DecodeBox
from nearsight.data.decode_worker import MAX_JPEG_SCANS
from nearsight.data.images import ImageLoadError


def _photo() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (96, 64), (200, 30, 30)).save(out, format="JPEG", progressive=True)
    return out.getvalue()


@pytest.fixture(scope="module")
def box():
    with DecodeBox(1, timeout_s=10) as opened:
        yield opened


def test_a_jpeg_of_more_scans_than_an_encoder_writes_is_refused_before_decoding(box):
    with pytest.raises(ImageLoadError, match=f"an encoder writes at most {MAX_JPEG_SCANS}"):
        box.decode_bytes(jpeg_scan_bomb(64, 2 * MAX_JPEG_SCANS), "scans.jpg", 32)
    assert box.decode_bytes(_photo(), "photo.jpg", 32).image.size == (48, 32)


def test_a_worker_killed_while_idle_is_not_blamed_on_the_next_image(box):
    photo = _photo()
    box.decode_bytes(photo, "warm.jpg", 32)
    for _ in range(6):  # the kill lands before, during or after the next request is sent
        (pid,) = box.pids
        os.kill(pid, signal.SIGKILL)
        fitted = box.decode_bytes(photo, "photo.jpg", 32)
        assert fitted.image.size == (48, 32)


@pytest.mark.parametrize("kind", ["stdin", "fifo", "folder"])
def test_only_regular_files_are_opened(box, tmp_path, kind):
    if kind == "stdin":
        path = "/dev/stdin"
    elif kind == "fifo":
        path = tmp_path / "pipe.jpg"
        os.mkfifo(path)
    else:
        path = tmp_path
    refusal = "it is a folder, not an image file" if kind == "folder" else "not a regular file"
    with pytest.raises(ImageLoadError, match=refusal):
        box.decode_file(path, 32)
    assert box.decode_bytes(_photo(), "photo.jpg", 32).image.size == (48, 32)
