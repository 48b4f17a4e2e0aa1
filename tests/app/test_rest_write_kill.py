"""A REST write killed midway: `nearsight serve --allow-writes` in a process of its own takes a
burst of item posts from several clients and is SIGKILLed while posts are in flight. After it,
the gallery opens; its catalog and its vectors agree (as many items as ids, each id's vector
stored); every post the server acknowledged (201) is there, and each new item is found by its
own vector at rank 1; nothing is left in the gallery folder beyond what the CLI's crash tests
accept (a segment the catalog does not list, or its temporary, and the image being written,
swept by the next writer), and the next REST write leaves only the gallery's own files."""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from helpers import running_page, serve_process
from PIL import Image

from nearsight.index.catalog.store import CATALOG_FILE
from nearsight.index.gallery.files import EMBEDDINGS_FILE, INDEX_FILE
from nearsight.index.gallery.payload import PAYLOAD_FILE
from nearsight.index.gallery.segments import SEGMENT_PATTERN

POSTS = 48
CLIENTS = 6
KILL_AFTER = 6  # acknowledged posts before the kill: the others are in flight or waiting
# a segment being written (nearsight/index/gallery/segments.py sweeps these too)
SEGMENT_TEMPORARY = re.compile(r"\.segment-\d{12}\.npz\.[0-9]+\.tmp")
SQLITE_SIDE_FILES = {f"{CATALOG_FILE}-wal", f"{CATALOG_FILE}-shm", f"{CATALOG_FILE}-journal"}


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.slow  # a server process (imports onnxruntime and the model)
def test_a_server_killed_mid_write_leaves_a_whole_gallery(shop, tmp_path):
    from nearsight import open_gallery
    from nearsight.index.gallery.core import Gallery

    folder = tmp_path / "catalog"
    shutil.copytree(shop["gallery"], folder)
    with Gallery.open(folder) as gallery:
        before = len(gallery)
        listed_before = list(gallery.meta.get("segments") or [])
    acknowledged: list[str] = []
    done = threading.Lock()
    with serve_process(["--gallery", folder, "--allow-writes", "--no-access-log",
                        "--watch-interval", "0"]) as (url, process):  # fmt: skip

        def post(number: int) -> None:
            key = f"KILL-{number:03d}"
            try:
                answer = httpx.post(
                    f"{url}/api/items", timeout=60,
                    files={"image": (f"{key}.png", _png(number), "image/png")},
                    data={"key": key, "meta": json.dumps({"name": key, "price": number})},
                )  # fmt: skip
            except httpx.TransportError:  # the server died under it
                return
            if answer.status_code == 201:
                with done:
                    acknowledged.append(key)

        with ThreadPoolExecutor(CLIENTS) as pool:
            for number in range(POSTS):
                pool.submit(post, number)
            deadline = time.monotonic() + 120
            while len(acknowledged) < KILL_AFTER and time.monotonic() < deadline:
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)  # posts are in flight: CLIENTS at once
            assert process.wait(timeout=30) == -signal.SIGKILL
        assert KILL_AFTER <= len(acknowledged) < POSTS  # killed midway, not before or after

    names = {path.name for path in folder.iterdir()}
    own = {CATALOG_FILE, EMBEDDINGS_FILE, INDEX_FILE, PAYLOAD_FILE} | SQLITE_SIDE_FILES
    with Gallery.open(folder) as gallery:  # a reader: it writes nothing
        listed = set(gallery.meta.get("segments") or [])
        ids = np.asarray(gallery.ids)
        assert len(gallery) == len(ids) == len(set(ids.tolist()))
        vectors = gallery.vectors_of(ids)
        assert vectors.shape == (len(ids), gallery.dim) and np.isfinite(vectors).all()
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        rows = gallery.items(ids.tolist())
        assert [int(row["id"]) for row in rows] == ids.tolist()
        keys = {row["meta"].get("sku"): int(row["id"]) for row in rows}
    strays = {
        name
        for name in names - own - listed
        if SEGMENT_PATTERN.fullmatch(name) or SEGMENT_TEMPORARY.fullmatch(name)
    }
    assert names - own - listed - strays == set(), names  # no other leftover
    assert len(strays) <= 1  # at most the segment of the write the kill stopped
    assert listed_before == [] or set(listed_before) <= listed
    posted = sorted(key for key in keys if key and key.startswith("KILL-"))
    assert set(acknowledged) <= set(posted)  # an acknowledged write is on disk
    assert len(keys) == before + len(posted) == len(ids)  # nothing half-added

    with open_gallery(folder) as searcher:  # each new item is its own nearest neighbour
        for key in posted:
            found = searcher.search_vector(searcher.vector(keys[key]), 1)
            assert found[0].key == key and found[0].distance == pytest.approx(0.0, abs=1e-5)
    images = folder.parent / f"{folder.name}.images"
    temporary = [path.name for path in images.iterdir() if path.name.startswith(".")]
    assert len(temporary) <= 1 and all(n.endswith(".tmp") for n in temporary)  # the one stopped

    # the next REST write (a server started again; in this process, as the kill is behind us)
    # sweeps the stray segment and image file
    with running_page([folder], analyse=False, allow_writes=True) as (url, _):
        again = httpx.post(f"{url}api/items", timeout=60, data={"key": "AFTER"},
                           files={"image": ("after.png", _png(POSTS + 1), "image/png")})  # fmt: skip
        assert again.status_code == 201, again.text
    with Gallery.open(folder) as gallery:
        listed = set(gallery.meta.get("segments") or [])
        assert len(gallery) == len(ids) + 1
    assert {path.name for path in folder.iterdir()} - own - listed == set()
    assert [path.name for path in images.iterdir() if path.name.startswith(".")] == []
