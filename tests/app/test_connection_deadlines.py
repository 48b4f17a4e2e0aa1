"""A deadline on writing an answer, a bound on pipelined requests (issue 51, item 7), and no
route answered without the key behind a trusted proxy (item 11).

Before: 229 connections that pipelined `GET /api/health` and never read stayed open for 108 s
and slowed everyone; `/gradio_api/startup-events` answered without the key whenever the socket
was a loopback one, including a local proxy's."""

from __future__ import annotations

import socket
import time

import httpx
from helpers import address_of, running_page

from nearsight.app.server_app import served

KEY = "k" * 24
BIG = "/api/docs-assets/swagger-ui-bundle.js"  # 1.5 MB: eight fill any socket buffer


def _pipelining(source: str, address: tuple[str, int], count: int, path: str) -> socket.socket:
    """A connection from ``source`` with a 2 KB receive window that sends ``count`` requests at
    once and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(address)
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    sock.sendall(request * count)
    return sock


def _drain(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the server sent within ``seconds``, and whether it closed the connection."""
    data, deadline = b"", time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def test_a_connection_is_closed_past_its_pipelined_requests(onnx_gallery):
    options = {"max_pipelined": 4, "keep_alive": 30.0}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, demo):
        sock = _pipelining("127.0.3.2", address_of(url), 200, "/api/health")
        time.sleep(1)  # the server answers what it will
        data, closed = _drain(sock, 15)
        sock.close()
        answered = data.count(b"HTTP/1.1 200")
        assert closed and 1 <= answered <= 1 + 4, answered
        assert served(demo).connections.pipelined >= 1
        assert httpx.get(f"{url}api/health", timeout=30).status_code == 200


def test_an_answer_that_does_not_drain_in_time_closes_its_connection(onnx_gallery):
    """Big answers pipelined to a client that reads nothing fill the server's buffer: within
    the write deadline (1 s here) the connection is closed, not held."""
    options = {"write_timeout": 1.0, "max_pipelined": 64, "keep_alive": 60.0}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, demo):
        connections = served(demo).connections
        socks = [_pipelining(f"127.0.4.{2 + n}", address_of(url), 8, BIG)
                 for n in range(4)]  # fmt: skip
        for _ in range(100):  # at most 20 s
            if connections.stalled >= len(socks):
                break
            time.sleep(0.2)
        assert connections.stalled >= len(socks), connections.stalled
        for sock in socks:
            sock.close()
        assert httpx.get(f"{url}api/health", timeout=30).status_code == 200


def test_no_route_answers_without_the_key_behind_a_local_proxy(onnx_gallery):
    options = {"api_key": KEY, "forwarded_allow_ips": "127.0.0.1"}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        for path in ("gradio_api/startup-events", "gradio_api/info", "config"):
            answer = httpx.get(f"{url}{path}", timeout=30)
            assert answer.status_code == 401, (path, answer.status_code)
        keyed = httpx.get(f"{url}gradio_api/info", headers={"X-API-Key": KEY}, timeout=30)
        assert keyed.status_code == 200
