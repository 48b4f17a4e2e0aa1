"""Live galleries (issue 26): a running server sees `index add`, `remove` and `compact` made by
another process within a few seconds, without a restart, and /api/health reports each
gallery's item count and generation."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import httpx
import pytest
from helpers import running_page

from nearsight.app.serve.live import GalleryWatcher, fingerprint

WATCH_S = 0.2
VISIBLE_WITHIN_S = 5.0


def cli(*argv) -> None:
    """``nearsight *argv`` in another process, as a user would run it beside the server."""
    done = subprocess.run([sys.executable, "-m", "nearsight.app.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def wait_for(predicate, timeout: float = VISIBLE_WITHIN_S) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"not seen within {timeout} s")


@pytest.fixture
def served(onnx_gallery, tmp_path):
    gallery = tmp_path / "gallery"
    shutil.copytree(onnx_gallery.gallery, gallery)
    with running_page([gallery], analyse=False, watch_interval=WATCH_S) as (url, _demo):
        yield url.rstrip("/") + "/api", gallery


def health(api: str) -> dict:
    return httpx.get(f"{api}/health", timeout=30).json()["galleries"][0]


def test_add_remove_and_compact_by_another_process_are_served_without_a_restart(
    served, onnx_gallery
):
    api, gallery = served
    before = health(api)
    assert (before["items"], before["generation"]) == (12, 0)

    cli("index", "add", "--gallery", gallery, onnx_gallery.query, "--workers", "0")
    wait_for(lambda: health(api)["items"] == 13)
    after_add = health(api)
    assert after_add["generation"] >= 1
    new_id = 12  # ids are never reused: the next id after 0..11
    reply = httpx.post(f"{api}/search", data={"id": new_id, "k": 3}, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["neighbours"][0]["id"] == new_id

    cli("index", "remove", "--gallery", gallery, "--ids", new_id)
    wait_for(lambda: health(api)["items"] == 12)
    assert httpx.get(f"{api}/items/{new_id}", timeout=30).status_code == 404

    generation = health(api)["generation"]
    cli("index", "compact", "--gallery", gallery)
    wait_for(lambda: health(api)["generation"] > generation)
    assert health(api)["items"] == 12
    reply = httpx.post(f"{api}/search", data={"id": 3, "k": 2}, timeout=30)
    assert reply.status_code == 200 and reply.json()["neighbours"][0]["id"] == 3


def test_a_search_during_a_reload_sees_one_whole_state(onnx_gallery, tmp_path):
    """The watcher swaps a whole new view in one assignment: a reference taken before the
    swap keeps answering from the old state, the next lookup gets the new one."""
    from nearsight.app.page.view import open_views

    gallery = tmp_path / "gallery"
    shutil.copytree(onnx_gallery.gallery, gallery)
    (view,) = open_views([gallery], device="cpu")
    views = {view.name: view}
    watcher = GalleryWatcher(views)
    assert watcher.check() == []  # nothing changed
    seen = fingerprint(gallery)
    cli("index", "add", "--gallery", gallery, onnx_gallery.query, "--workers", "0")
    assert fingerprint(gallery) != seen
    assert watcher.check() == [view.name]
    fresh = views[view.name]
    assert (len(view), len(fresh), fresh.generation) == (12, 13, 1)
    assert len(view.search_item(0, 13)) == 12  # the old snapshot stays whole
    assert len(fresh.search_item(0, 13)) == 13
    fresh.close()
    view.close()
