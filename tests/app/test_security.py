"""One API key for every route, bodies bounded while they stream, no server paths, metrics
(issue 26), against the real server on 127.0.0.1 over a tiny ONNX gallery."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from multiprocessing.pool import ThreadPool

import httpx
import pytest
from gradio_client import Client, handle_file
from helpers import free_port, serve_process, server_settings

from nearsight.app.page.layout import build_app
from nearsight.app.server_app import launch_app, stop_app

KEY = "s3cret-key-for-tests"
MAX_UPLOAD_MB = 1.0


@contextlib.contextmanager
def serving(galleries, show_paths: bool = False, **options):
    demo = build_app(galleries, device="cpu", analyse=False, show_paths=show_paths)
    url = launch_app(demo, server_settings(max_upload_mb=MAX_UPLOAD_MB, **options))
    try:
        yield url.rstrip("/")
    finally:
        stop_app(demo)


@pytest.fixture(scope="module")
def keyed(onnx_gallery):
    with serving([onnx_gallery.gallery], api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def keyless(onnx_gallery):
    """The no-key loopback server with its defaults (its tests only read it)."""
    with serving([onnx_gallery.gallery]) as url:
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


def test_results_name_items_below_the_gallery_unless_show_paths(keyless, onnx_gallery):
    root = str(onnx_gallery.data)
    url = keyless
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


@pytest.fixture(scope="module")
def env_keyed_process(onnx_gallery):
    """(url, stderr lines): `nearsight serve` in a process of its own with its defaults, its key
    from NEARSIGHT_API_KEY; its stderr (the access log) read as it comes. Shared by the key and
    access log tests: neither changes it."""
    env = {"NEARSIGHT_API_KEY": KEY}
    args = ["--gallery", onnx_gallery.gallery]
    with serve_process(args, env=env, stderr=subprocess.PIPE) as (url, server):
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(server.stderr.readline, "")),
                                  daemon=True)  # fmt: skip
        reader.start()
        yield url, lines
    reader.join(30)


def test_the_key_can_come_from_a_file_or_the_environment(env_keyed_process, onnx_gallery,
                                                         tmp_path):  # fmt: skip
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    args = ["--gallery", onnx_gallery.gallery, "--api-key-file", key_file]
    with serve_process(args) as (from_file, _):
        for url in (from_file, env_keyed_process[0]):
            assert httpx.get(f"{url}/api/items/0", timeout=10).status_code == 401
            ok = httpx.get(f"{url}/api/items/0", headers={"X-API-Key": KEY}, timeout=10)
            assert ok.status_code == 200
        assert (  # while both servers run: on no process's command line
            shutil.which("ps") is None
            or KEY not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                         text=True).stdout
        )  # fmt: skip


def test_slow_headers_and_stalled_bodies_are_cut_off(onnx_gallery):
    """A client that never finishes its headers is disconnected after --header-timeout; one
    whose body stalls gets 408 after --body-timeout (here 1 s each; without them uvicorn
    keeps both connections for as long as the client likes)."""
    import socket
    from urllib.parse import urlsplit

    with serving([onnx_gallery.gallery], header_timeout=1.0, body_timeout=1.0) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=15) as slow:
            slow.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
            started = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 10
        with socket.create_connection((address.hostname, address.port), timeout=15) as stall:
            stall.sendall(b"POST /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n"
                          b"Content-Type: multipart/form-data; boundary=x\r\n\r\n--x\r\n")  # fmt: skip
            answer = stall.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408")


# -- issue 33: hosts, sign-in, wrong keys, the access log --------------------------------------


def _from(address: str) -> httpx.Client:
    """A client whose requests come from ``address`` (another loopback address)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def test_other_hosts_and_origins_are_refused_before_any_route(keyless, onnx_gallery):
    """DNS rebinding: a no-key server on loopback answered any Host, and Gradio's CORS handling
    reflected any Origin with credentials for a non-local Host."""
    url = keyless
    port = url.rsplit(":", 1)[1]
    rebound = httpx.get(f"{url}/api/health", headers={"Host": f"evil.example:{port}"})
    assert rebound.status_code == 400 and "evil.example" in rebound.json()["error"]
    config = httpx.get(f"{url}/config", headers={"Host": "evil.example"})
    assert config.status_code == 400 and "access-control-allow-origin" not in config.headers
    for origin in ("http://evil.example", "null"):
        cross = httpx.get(f"{url}/config", headers={"Origin": origin})
        assert cross.status_code == 403, origin
        assert "access-control-allow-origin" not in cross.headers
        preflight = httpx.options(f"{url}/gradio_api/queue/join", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert preflight.status_code == 403
        assert "access-control-allow-origin" not in preflight.headers
    for host in ("localhost", f"127.0.0.1:{port}", "[::1]"):
        assert httpx.get(f"{url}/api/health", headers={"Host": host}).status_code == 200
    same = httpx.get(f"{url}/config", headers={"Origin": f"http://localhost:{port}"})
    assert same.status_code == 200
    with serving([onnx_gallery.gallery], allowed_hosts="search.example") as url:
        named = httpx.get(f"{url}/api/health", headers={"Host": "search.example"})
        assert named.status_code == 200


def test_openapi_declares_the_key(keyed):
    schema = httpx.get(f"{keyed}/api/openapi.json", headers={"X-API-Key": KEY}).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["APIKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert schemes["Bearer"]["scheme"].lower() == "bearer"
    search = schema["paths"]["/search"]["post"]
    assert {"APIKey": []} in search["security"] and {"Bearer": []} in search["security"]


def test_the_api_is_answered_behind_the_guard_past_gradios_middleware(keyed):
    # Gradio's Brotli layer compressed this answer when /api went through Gradio's middleware
    br = {"X-API-Key": KEY, "Accept-Encoding": "br"}
    schema = httpx.get(f"{keyed}/api/openapi.json", headers=br, timeout=30)
    assert schema.status_code == 200 and "/search" in schema.json()["paths"]
    assert "content-encoding" not in schema.headers
    assert httpx.get(f"{keyed}/api/docs", headers=br, timeout=30).status_code == 200
    assert httpx.get(f"{keyed}/api/openapi.json", timeout=30).status_code == 401


def test_wrong_keys_are_slowed_then_refused_per_client(keyed):
    """Five wrong keys are answered at once, the next ones later and later, and from the 20th
    within a minute the address gets 429 whatever key it sends; another address is not
    affected (before: ~250 guesses/s, nothing slowed)."""
    with _from("127.0.5.2") as attacker:
        quick = []
        for number in range(5):
            started = time.monotonic()
            reply = attacker.get(f"{keyed}/api/items/0", headers={"X-API-Key": f"guess-{number}"})
            quick.append(time.monotonic() - started)
            assert reply.status_code == 401
        started = time.monotonic()
        sixth = attacker.get(f"{keyed}/api/items/0", headers={"X-API-Key": "guess-5"})
        assert sixth.status_code == 401
        slowed = time.monotonic() - started
        with ThreadPool(14) as pool:  # the 7th to 20th guesses, held back at once
            codes = pool.map(lambda n: _guess(keyed, n), range(6, 20))
        assert codes == [401] * 14
        locked = attacker.get(f"{keyed}/api/items/0", headers={"X-API-Key": KEY})
        form = attacker.post(f"{keyed}/login", data={"key": KEY})
    assert max(quick) < slowed and slowed >= 0.1
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert form.status_code == 429
    with _from("127.0.6.2") as other:
        assert other.get(f"{keyed}/api/items/0", headers={"X-API-Key": KEY}).status_code == 200


def _guess(url: str, number: int) -> int:
    with _from("127.0.5.2") as attacker:
        reply = attacker.get(f"{url}/api/items/0", headers={"X-API-Key": f"guess-{number}"})
    return reply.status_code


def test_the_session_cookie_expires_and_dies_with_the_key(onnx_gallery):
    with (
        serving([onnx_gallery.gallery], api_key=KEY, session_s=2.0) as url,
        httpx.Client(base_url=url, timeout=30) as browser,
    ):
        signed = browser.post("/login", data={"key": KEY})
        cookie = signed.headers["set-cookie"]
        assert "Max-Age=2" in cookie and "HttpOnly" in cookie and "Secure" not in cookie
        assert browser.get("/gradio_api/info").status_code == 200
        token = browser.cookies["nearsight_session"]
        time.sleep(2.5)
        assert browser.get("/gradio_api/info").status_code == 401  # expired
    with serving([onnx_gallery.gallery], api_key=KEY + "-changed", secure_cookie=True) as url:
        old = httpx.get(f"{url}/gradio_api/info", cookies={"nearsight_session": token})
        assert old.status_code == 401  # a cookie of the previous key
        signed = httpx.post(f"{url}/login", data={"key": KEY + "-changed"})
        assert "; Secure" in signed.headers["set-cookie"]


def test_a_stalled_sign_in_form_is_a_408_not_a_traceback(onnx_gallery, capfd):
    import socket
    from urllib.parse import urlsplit

    with serving([onnx_gallery.gallery], api_key=KEY, body_timeout=1.0) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=15) as stall:
            stall.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n"
                          b"Content-Type: application/x-www-form-urlencoded\r\n\r\nkey=")  # fmt: skip
            answer = stall.recv(4096)
        huge = httpx.post(f"{url}/login", content=b"key=" + b"x" * 10_000,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert huge.status_code == 413
    assert "Traceback" not in capfd.readouterr().err


def test_a_short_key_is_refused_beyond_loopback(onnx_gallery, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("a\n")
    done = subprocess.run(
        [sys.executable, "-m", "nearsight.app.cli", "serve", "--gallery",
         str(onnx_gallery.gallery), "--host", "0.0.0.0", "--port", str(free_port()),
         "--api-key-file", str(key_file)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("nearsight: error:")]
    assert len(lines) == 1 and "at least 16" in lines[0], done.stderr


def test_the_access_log_is_on_by_default(env_keyed_process):
    url, lines = env_keyed_process
    key = {"X-API-Key": KEY}
    wanted = (
        "nearsight: 127.0.0.1 GET /api/health 200 ",
        "nearsight: 127.0.0.1 GET /api/items/999 404 ",
    )
    httpx.get(f"{url}/api/health?secret=x", timeout=10)
    assert httpx.get(f"{url}/api/items/999", headers=key, timeout=10).status_code == 404
    deadline = time.monotonic() + 30  # the lines reach the pipe as the answers leave
    while time.monotonic() < deadline and not all(
        any(line.startswith(w) for line in list(lines)) for w in wanted
    ):
        time.sleep(0.1)
    err = "".join(lines)
    for line in wanted:
        assert line in err, err
    assert "secret" not in err
