"""One API key for every route, bodies bounded while they stream, no server paths, metrics
(issue 26), against the real server on 127.0.0.1 over a tiny ONNX gallery."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from gradio_client import Client, handle_file
from helpers import free_port

from nearsight.app.page import build_app
from nearsight.app.rest import close_rest_app
from nearsight.app.server import launch_app

KEY = "s3cret-key-for-tests"
MAX_UPLOAD_MB = 1.0


@contextlib.contextmanager
def serving(galleries, show_paths: bool = False, **options):
    demo = build_app(galleries, device="cpu", analyse=False, show_paths=show_paths)
    url = launch_app(demo, port=free_port(), prevent_thread_lock=True, quiet=True,
                     max_upload_mb=MAX_UPLOAD_MB, **options)  # fmt: skip
    try:
        yield url.rstrip("/")
    finally:
        demo.close(verbose=False)
        close_rest_app(demo.nearsight_api)
        demo.nearsight.close()


@pytest.fixture(scope="module")
def keyed(onnx_gallery):
    with serving([onnx_gallery.gallery], api_key=KEY) as url:
        yield url


def test_every_route_but_health_needs_the_key(keyed):
    open_routes = {"/api/health"}
    for path in ("/", "/config", "/gradio_api/info", "/gradio_api/upload", "/api/docs",
                 "/api/openapi.json", "/api/items/0", "/metrics", "/gradio_api/queue/status",
                 "/gradio_api/file=/etc/passwd", *open_routes):  # fmt: skip
        reply = httpx.get(f"{keyed}{path}", timeout=30)
        if path in open_routes:
            assert reply.status_code == 200, path
        else:
            assert reply.status_code == 401, (path, reply.status_code)
    reply = httpx.post(f"{keyed}/api/search", data={"id": 0}, timeout=30)
    assert reply.status_code == 401
    for headers in ({"X-API-Key": KEY}, {"Authorization": f"Bearer {KEY}"}):
        reply = httpx.post(f"{keyed}/api/search", data={"id": 0, "k": 2}, headers=headers,
                           timeout=30)  # fmt: skip
        assert reply.status_code == 200, reply.text
    wrong = httpx.post(f"{keyed}/api/search", data={"id": 0}, headers={"X-API-Key": "nope"})
    assert wrong.status_code == 401


def test_a_browser_signs_in_once_and_then_uses_the_page(keyed):
    page = httpx.get(f"{keyed}/", headers={"Accept": "text/html"}, timeout=30)
    assert page.status_code == 401 and "<form" in page.text
    with httpx.Client(base_url=keyed, timeout=30) as browser:
        bad = browser.post("/login", data={"key": "wrong"})
        assert bad.status_code == 401 and "wrong key" in bad.text
        good = browser.post("/login", data={"key": KEY})
        assert good.status_code == 303 and "HttpOnly" in good.headers["set-cookie"]
        assert browser.get("/", headers={"Accept": "text/html"}).status_code == 200
        assert browser.get("/gradio_api/info").status_code == 200


def test_gradio_client_needs_the_key(keyed, onnx_gallery):
    with pytest.raises(Exception):  # noqa: B017  (refused while connecting: 401 on /config)
        Client(keyed, verbose=False)
    client = Client(keyed, headers={"X-API-Key": KEY}, verbose=False)
    found = client.predict(handle_file(str(onnx_gallery.query)), 3, None, api_name="/search")
    assert '"id"' in found


def _chunks(total_mb: int, pulled: list[int]):
    """A multipart body whose one file part goes on for ``total_mb`` MB."""
    yield (b'--x\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
           b"Content-Type: image/png\r\n\r\n")  # fmt: skip
    block = b"\0" * (256 * 1024)
    for _ in range(total_mb * 4):
        pulled[0] += len(block)
        yield block


def test_a_chunked_200_mb_body_without_the_key_is_refused_before_it_is_read(keyed):
    pulled = [0]
    try:
        reply = httpx.post(f"{keyed}/gradio_api/upload", content=_chunks(200, pulled),
                           headers={"Content-Type": "multipart/form-data; boundary=x"},
                           timeout=60)  # fmt: skip
        assert reply.status_code == 401
    except httpx.TransportError:
        pass  # the server answered 401 and closed while the client was still sending
    # what left the client fits in the sockets' buffers: the server read none of it
    assert pulled[0] < 32 * 1024 * 1024


def test_a_chunked_body_over_the_limit_with_the_key_is_refused_while_it_streams(keyed):
    pulled = [0]
    try:
        reply = httpx.post(f"{keyed}/api/search", content=_chunks(200, pulled),
                           headers={"X-API-Key": KEY, "Content-Type": "multipart/form-data; "
                                    "boundary=x"}, timeout=60)  # fmt: skip
        assert reply.status_code == 413
    except httpx.TransportError:
        pass
    assert pulled[0] < 32 * 1024 * 1024


def test_results_name_items_below_the_gallery_unless_show_paths(onnx_gallery):
    root = str(onnx_gallery.data)
    with serving([onnx_gallery.gallery]) as url:
        found = httpx.post(f"{url}/api/search", data={"id": 0, "k": 3}).json()["neighbours"]
        item = httpx.get(f"{url}/api/items/0").json()
        client = Client(url, verbose=False)
        gradio = client.predict(handle_file(str(onnx_gallery.query)), 3, None, api_name="/search")
    assert found and not any(root in n["path"] or n["path"].startswith("/") for n in found)
    assert not item["path"].startswith("/") and root not in gradio
    with serving([onnx_gallery.gallery], show_paths=True) as url:
        found = httpx.post(f"{url}/api/search", data={"id": 0, "k": 3}).json()["neighbours"]
    assert all(n["path"].startswith(root) for n in found)


def test_metrics_count_requests_and_gallery_sizes(keyed):
    headers = {"X-API-Key": KEY}
    httpx.post(f"{keyed}/api/search", data={"id": 1, "k": 2}, headers=headers, timeout=30)
    text = httpx.get(f"{keyed}/metrics", headers=headers, timeout=30).text
    assert 'nearsight_requests_total{route="/api/search",status="200"}' in text
    assert "nearsight_request_seconds_bucket" in text
    assert "nearsight_gallery_items" in text and "nearsight_embed_queue" in text


def test_the_key_can_come_from_a_file_or_the_environment(onnx_gallery, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    for extra, env in ((["--api-key-file", str(key_file)], {}), ([], {"NEARSIGHT_API_KEY": KEY})):
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "nearsight.app.cli", "serve", "--gallery",
             str(onnx_gallery.gallery), "--port", str(port), "--analysis-max-items", "0", *extra],
            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                        break
                time.sleep(0.2)
            assert httpx.get(f"{url}/api/items/0", timeout=10).status_code == 401
            ok = httpx.get(f"{url}/api/items/0", headers={"X-API-Key": KEY}, timeout=10)
            assert ok.status_code == 200
        finally:
            server.terminate()
            server.wait(30)
    assert shutil.which("ps") is None or KEY not in subprocess.run(
        ["ps", "-eo", "args"], capture_output=True, text=True
    ).stdout


def test_slow_headers_and_stalled_bodies_are_cut_off(onnx_gallery):
    """A client that never finishes its headers is disconnected after --header-timeout; one
    whose body stalls gets 408 after --body-timeout (here 1 s each; without them uvicorn
    keeps both connections for as long as the client likes)."""
    import socket
    from urllib.parse import urlsplit

    with serving([onnx_gallery.gallery], header_timeout_s=1.0, body_timeout_s=1.0) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=15) as slow:
            slow.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            started = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 10
        with socket.create_connection((address.hostname, address.port), timeout=15) as stall:
            stall.sendall(b"POST /api/search HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                          b"Content-Type: multipart/form-data; boundary=x\r\n\r\n--x\r\n")  # fmt: skip
            answer = stall.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408")
