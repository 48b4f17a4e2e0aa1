"""One owner of the open galleries (nearsight/app/serve/galleries.py): the page and the REST API
read the same galleries from it, the launcher never reaches into the page, and the server
answers /api from its first request (no 404 while the API is being mounted)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from helpers import free_port, running_page


def test_the_page_and_rest_read_one_owner(product):
    from nearsight.app.server_app import served

    with running_page([product["gallery"]], analyse=False) as (url, demo):
        owner = served(demo).galleries
        assert owner is demo.nearsight.galleries
        assert served(demo).rest.state.rest.galleries is owner
        # a reload swaps the entry once, and both faces see the new view on their next request
        (name,) = owner.names
        old = owner.get(name)
        fresh = old.reopened()
        owner.views[name] = fresh
        assert demo.nearsight.view(name) is fresh
        health = httpx.get(f"{url}api/health", timeout=30).json()
        assert health["galleries"][0]["generation"] == old.generation + 1
        old.close()


def test_serve_and_live_do_not_import_the_page():
    code = (
        "import sys, nearsight.app.serve.galleries, nearsight.app.serve.live, nearsight.app.rest\n"
        "print(sorted(m for m in sys.modules if m.startswith('nearsight.app.page')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_api_answers_from_the_servers_first_request(onnx_gallery):
    """Poll /api/health from the moment the port accepts connections: never a 404. (An ONNX
    gallery, as served: no torch to import before the port opens.)"""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "nearsight.app.cli", "serve", "--gallery", str(onnx_gallery.gallery),
         "--port", str(port), "--analysis-max-items", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    statuses: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while len(statuses) < 20 and time.monotonic() < deadline:
            assert process.poll() is None, "the server exited"
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=10)
            except httpx.TransportError:  # not listening yet
                time.sleep(0.005)
                continue
            statuses.append(reply.status_code)
    finally:
        process.terminate()
        process.wait(30)
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
