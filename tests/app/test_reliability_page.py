"""The page under load and under attack: `nearsight serve` in its own process on 127.0.0.1,
driven over HTTP the way gradio_client does it (upload, call, read the event stream).

- load: 8 concurrent clients x 50 queries (every 10th one a file that is not an image): every
  answer right (each query is a gallery file, so it must come back first at distance 0, with
  the k its client asked for), every bad file refused with its one-line message, and the
  server's resident memory (/proc/PID/status VmRSS) bounded after a warm-up round;
- files: the API's file inputs take only files uploaded to this server (a path to a secret, a
  gallery image, a symlink in a gallery folder, a path climbing out of the upload cache are
  refused), and the file route serves nothing outside the upload cache.

Already in tests/app/test_page.py (not repeated): an oversized upload is refused (HTTP 413), a
non-image and an empty upload get a clear message, and /gradio_api/file= refuses /etc/passwd,
a secret file, a symlink in a gallery folder, gallery images and the catalog, with plain and
%2e-encoded ../ traversals.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

CLIENTS = 8
QUERIES = 50  # per client
WARM_UP = 5  # per client, before the first memory reading
BAD_EVERY = 10  # every 10th query of a client uploads a file that is not an image
MAX_GROWTH_MB = 100.0
SECRET = "top secret: not an image of any gallery"


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    root: Path
    items: list[dict]
    secret: Path
    link: Path  # a symlink in a gallery image folder, pointing at the secret
    bad: Path  # a text file named like an image
    cache: Path  # GRADIO_TEMP_DIR of the server
    gallery: Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident memory of a process (psutil is not a dependency; Linux has /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.fixture(scope="module")
def server(onnx_gallery, tmp_path_factory) -> Server:
    """The page tests' gallery, secret and symlink (6 classes x 4 synthetic images, a secret
    beside them, a link to it in an image folder), embedded by the session's ONNX ResNet-18:
    400 queries in a test, and the page code is the same for any network; an ONNX model keeps
    torch out of the server, as it is served."""
    from helpers import started

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.index.gallery.core import Gallery

    root = tmp_path_factory.mktemp("reliability-page")
    write_synthetic(root / "data", classes=6, per_class=4, size=32)
    gallery = root / "gallery"
    assert main(["index", "build", "--model", str(onnx_gallery.model), "--dataset", "folder",
                 "--root", str(root / "data"), "--split", "all", "--out", str(gallery),
                 "--workers", "0"]) == 0  # fmt: skip
    with Gallery.open(gallery) as opened:
        items = opened.all_items()
    secret = root / "secret.txt"
    secret.write_text(SECRET + "\n")
    link = Path(items[0]["path"]).parent / "link-to-secret.png"
    link.symlink_to(secret)
    bad = root / "notes.png"
    bad.write_text("this is not an image\n")
    cache = root / "gradio-cache"

    port = free_port()
    env = {**os.environ, "GRADIO_TEMP_DIR": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    with started(
        [sys.executable, "-m", "nearsight.app.cli", "serve", "--gallery", gallery, "--port", port,
         "--device", "cpu", "--max-upload-mb", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    ) as process:  # fmt: skip
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, "nearsight serve exited"
            assert time.monotonic() < deadline, "nearsight serve did not answer in 180 s"
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        yield Server(url, process, root, items, secret, link, bad, cache, gallery)


# -- the HTTP protocol ----------------------------------------------------------------------------


def upload(http: httpx.Client, url: str, path: Path) -> str:
    with open(path, "rb") as handle:
        response = http.post(f"{url}gradio_api/upload", files={"files": (path.name, handle)})
    response.raise_for_status()
    return response.json()[0]  # where the server keeps it (in its upload cache)


def file_data(path: str | Path) -> dict:
    return {"path": str(path), "meta": {"_type": "gradio.FileData"}}


def call(http: httpx.Client, url: str, api: str, data: list) -> tuple[str, object]:
    """('complete', outputs) or ('error', message) of one call of ``api``."""
    response = http.post(f"{url}gradio_api/call/{api}", json={"data": data})
    response.raise_for_status()
    event_id = response.json()["event_id"]
    kind, payload = None, None
    with http.stream("GET", f"{url}gradio_api/call/{api}/{event_id}") as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ").strip()
            elif line.startswith("data: ") and kind in ("complete", "error"):
                payload = json.loads(line.removeprefix("data: "))
                break
    if kind == "error":
        return "error", (payload or {}).get("error") if isinstance(payload, dict) else payload
    return str(kind), payload


def search(http: httpx.Client, url: str, path: Path, k: int) -> tuple[str, object]:
    kind, payload = call(http, url, "search", [file_data(upload(http, url, path)), k, "gallery"])
    if kind == "complete":
        return kind, json.loads(payload[0])
    return kind, payload


# -- the load ---------------------------------------------------------------------------------


def run_clients(server: Server, first: int, count: int, latencies: list, failures: list) -> None:
    """CLIENTS threads, each sending its queries first .. first+count-1."""

    def client(number: int) -> None:
        k = number + 1  # each client its own k: an answer given to the wrong client shows
        with httpx.Client(timeout=120) as http:
            for query in range(first, first + count):
                start = time.perf_counter()
                try:
                    if query % BAD_EVERY == BAD_EVERY - 1:  # refused by the upload route
                        files = {"files": ("notes.png", server.bad.read_bytes())}
                        refused = http.post(f"{server.url}gradio_api/upload", files=files)
                        if (
                            refused.status_code != 415
                            or "cannot read image notes.png" not in refused.text
                        ):
                            failures.append(f"client {number} query {query}: {refused.text}")
                    else:
                        item = server.items[(number * 7 + query) % len(server.items)]
                        kind, rows = search(http, server.url, Path(item["path"]), k)
                        ok = (
                            kind == "complete"
                            and len(rows) == k
                            and rows[0]["id"] == item["id"]
                            and rows[0]["distance"] < 1e-3
                        )
                        if not ok:
                            failures.append(f"client {number} query {query}: {kind} {rows}")
                except Exception as error:  # noqa: BLE001 - every failure is collected
                    failures.append(f"client {number} query {query}: {error!r}")
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(thread.is_alive() for thread in threads), "a client hung"


@pytest.mark.slow  # 400 queries through a real server: ~20 s on 2 busy cores
def test_eight_clients_fifty_queries_each_no_error_and_bounded_memory(server):
    pid = server.process.pid
    latencies: list[float] = []
    failures: list[str] = []
    start_rss = rss_mb(pid)
    run_clients(server, 0, WARM_UP, latencies, failures)
    warm_rss = rss_mb(pid)
    start = time.perf_counter()
    run_clients(server, WARM_UP, QUERIES - WARM_UP, latencies, failures)
    seconds = time.perf_counter() - start
    end_rss = rss_mb(pid)

    assert failures == [], failures[:5]
    assert len(latencies) == CLIENTS * QUERIES
    assert server.process.poll() is None
    assert httpx.get(server.url, timeout=30).status_code == 200  # still serving
    latencies.sort()
    p50, p95 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.95)]
    print(
        f"\n{CLIENTS} clients x {QUERIES} queries: 0 failures; after warm-up "
        f"{CLIENTS * (QUERIES - WARM_UP)} queries in {seconds:.1f}s; latency p50 {p50 * 1000:.0f}"
        f" ms, p95 {p95 * 1000:.0f} ms; server RSS {start_rss:.0f} MB at start, "
        f"{warm_rss:.0f} MB after warm-up, {end_rss:.0f} MB at the end "
        f"(+{end_rss - warm_rss:.1f} MB)"
    )
    assert end_rss - warm_rss < MAX_GROWTH_MB


# -- files the server must not read or serve ----------------------------------------------------


def test_the_apis_take_only_files_uploaded_to_this_server(server):
    gallery_image = Path(server.items[3]["path"])
    with httpx.Client(timeout=60) as http:
        uploaded = upload(http, server.url, gallery_image)  # control: uploaded, it is searched
        upload_dir = Path(uploaded).parent
        foreign = [
            server.secret,
            server.link,
            gallery_image,  # a gallery image by its path: never read on a client's say-so
            Path("/etc/passwd"),
            upload_dir / ".." / ".." / server.secret.name,  # starts inside the upload cache
            Path(f"{upload_dir}/../../{server.secret.name}"),
        ]

        def inputs(api: str, path: str | Path) -> list:
            if api == "search":
                return [file_data(path), 3, "gallery"]
            return [
                "gallery",
                file_data(path),
                3,
                "-1",
                "",
                False,
            ]  # upload events (+ filter, rerank)

        for api in ("search", "search_grid", "image_changed"):
            kind, outputs = call(http, server.url, api, inputs(api, uploaded))
            assert kind == "complete", (api, outputs)  # the payload shape is right
            assert str(server.items[3]["id"]) in json.dumps(outputs)
            for path in foreign:
                kind, outputs = call(http, server.url, api, inputs(api, path))
                text = json.dumps(outputs)
                assert kind == "error", (api, path, text[:300])
                assert "top secret" not in text and "root:" not in text and '"id"' not in text


def test_the_file_route_serves_nothing_outside_the_upload_cache(server):
    with httpx.Client(timeout=30) as http:
        uploaded = upload(http, server.url, Path(server.items[5]["path"]))
        response = http.get(f"{server.url}gradio_api/file={uploaded}")
        assert response.status_code == 200 and response.content.startswith(b"\x89PNG")  # control
        folder = Path(uploaded).parent
        up = os.path.relpath(server.secret, folder)  # ../../secret.txt from the upload folder
        attempts = [
            f"{folder}/{up}",
            f"{folder}/{up}".replace("..", "%2e%2e"),
            f"{folder}/{up}".replace("..", "%252e%252e"),  # encoded twice
            f"{folder}/{up}".replace("/", "%2f"),
            f"{folder}/{up}".replace("/", "\\"),
            f"{folder}/{up}%00.png",
            f"{server.cache}/../{server.secret.name}",
            str(server.link),
        ]
        for target in attempts:
            for route in ("gradio_api/file=", "gradio_api/file/"):
                response = http.get(f"{server.url}{route}{target}")
                assert response.status_code >= 400, f"{route}{target} was served"
                assert SECRET.encode() not in response.content


# -- memory that grows per call -----------------------------------------------------------------


def test_sessions_kept_by_the_server_are_capped(server, monkeypatch):
    """Each plain-HTTP call of the API is a new Gradio session holding a copy of the page's
    config (~80 KB, measured): the server keeps the STATE_SESSIONS most recent ones, not
    Gradio's default 10000. Here with the cap lowered to 10, in a server of this process."""
    from helpers import server_settings

    import nearsight.app.page.layout as page_module
    import nearsight.app.server_app as server_module

    monkeypatch.setattr(server_module, "STATE_SESSIONS", 10)
    demo = page_module.build_app([server.gallery], device="cpu", analyse=False)
    url = server_module.launch_app(demo, server_settings())
    try:
        with httpx.Client(timeout=60) as http:
            for item in server.items[:25]:
                kind, rows = search(http, url, Path(item["path"]), 1)
                assert kind == "complete" and rows[0]["id"] == item["id"]
        assert len(demo.state_holder.session_data) == 10
    finally:
        server_module.stop_app(demo)
