"""Holding under attack, against a real server on 127.0.0.1: connections and who a client is.
A kept-alive connection that trickles its next request, one address opening every connection,
sign-in bodies and headers trickled from many addresses, a forged X-Forwarded-For, an Origin
on another port, and a body trickled past its total deadline on every route. Every loop is
bounded; a second client address is another loopback address (127.0.2.2).

Beside it: test_attack_floods.py (fair shares and budgets under floods) and
test_attack_decode.py (untrusted images in the decode box)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from multiprocessing.pool import ThreadPool

import httpx
import pytest
from helpers import running_page
from helpers.sockets import address_of, closed_within, connect_from, read_response


def test_a_kept_alive_connection_trickling_its_next_headers_is_closed(onnx_gallery):
    """After one answered request, the next request's headers sent a byte every 0.1 s: the
    header timeout (1 s here) covers that request too, so the server closes the connection
    (before, any byte cancelled the idle timer and nothing else applied: it stayed open)."""
    with (
        running_page([onnx_gallery.gallery], analyse=False, header_timeout=1.0) as (url, _),
        socket.create_connection(address_of(url), timeout=10) as sock,
    ):
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        trickle = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 150
        started, closed = time.monotonic(), False
        for byte in trickle:  # at most 15 s
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if closed_within(sock, 0.1):
                closed = True
                break
        held = time.monotonic() - started
    assert closed, f"still open after trickling for {held:.1f} s"
    assert held < 5.0


def test_an_idle_kept_alive_connection_is_closed(onnx_gallery):
    with (
        running_page([onnx_gallery.gallery], analyse=False, keep_alive=1.0) as (url, _),
        socket.create_connection(address_of(url), timeout=10) as sock,
    ):
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert closed_within(sock, 10.0)
        assert time.monotonic() - started < 5.0


def test_one_address_cannot_take_every_connection(onnx_gallery):
    """64 connections from 127.0.0.1 that never finish their headers, on a server that allows
    64 in all: past 32 (the per-client default) they are answered 429 at once, and a client
    at another address is still served (before: it got 503 while they stayed open)."""
    with running_page([onnx_gallery.gallery], analyse=False, max_connections=64) as (url, _):
        host, port = address_of(url)
        slow = []
        try:
            for _ in range(64):
                sock = socket.create_connection((host, port), timeout=10)
                sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                slow.append(sock)
            refused = 0
            for sock in slow:
                ready, _, _ = select.select([sock], [], [], 0.05)
                if ready and sock.recv(4096).startswith(b"HTTP/1.1 429"):
                    refused += 1
            transport = httpx.HTTPTransport(local_address="127.0.2.2")
            with httpx.Client(transport=transport, timeout=10) as other:
                answer = other.get(f"{url.rstrip('/')}/api/health")
        finally:
            for sock in slow:
                sock.close()
    assert refused == 32
    assert answer.status_code == 200, answer.text


# -- issue 39: budgets are totals, a client is its socket, origins are whole ------------------

KEY = "s3cret-key-for-attack-tests"
SIGN_IN_HEAD = (b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 400\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n\r\nkey=")  # fmt: skip


def test_trickled_sign_ins_from_many_addresses_are_closed_and_keyed_clients_served(onnx_gallery):
    """48 connections from four addresses (12 each, under the per-address cap) on a server that
    allows 32 in all, each sending a sign-in form a byte every 0.2 s: at most
    --max-unauthenticated (8) are read at once, each within --sign-in-timeout (3 s) in all,
    the rest are answered 503 at once; a keyed client at a fifth address is served while they
    are held (before: the deadline ran between reads, every connection stayed open for as long
    as it trickled, and every other client got 503)."""
    options = {"api_key": KEY, "max_connections": 32, "sign_in_timeout": 3.0,
               "max_unauthenticated": 8}  # fmt: skip
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        address = address_of(url)
        opened: dict[socket.socket, float] = {}
        for n in range(48):
            sock = connect_from(f"127.0.{2 + n % 4}.2", address)
            sock.sendall(SIGN_IN_HEAD)
            opened[sock] = time.monotonic()
        start = time.monotonic()
        served: list[float] = []

        def keyed() -> None:
            transport = httpx.HTTPTransport(local_address="127.0.9.2")
            with httpx.Client(transport=transport, timeout=10) as client:
                while time.monotonic() - start < 12 and not served:
                    with contextlib.suppress(httpx.TransportError):
                        reply = client.get(f"{url.rstrip('/')}/api/items/0",
                                           headers={"X-API-Key": KEY})  # fmt: skip
                        if reply.status_code == 200:
                            served.append(time.monotonic() - start)
                    time.sleep(0.1)

        client = threading.Thread(target=keyed)
        client.start()
        lifetimes, answers = [], []
        try:
            while opened and time.monotonic() - start < 20:  # bounded
                for sock in list(opened):
                    ready, _, _ = select.select([sock], [], [], 0)
                    try:
                        if not ready:
                            sock.sendall(b"k")
                            continue
                        answers.append(sock.recv(64)[:12])
                    except OSError:
                        answers.append(b"reset")
                    lifetimes.append(time.monotonic() - opened.pop(sock))
                    sock.close()
                time.sleep(0.2)
            last_closed = time.monotonic() - start
        finally:
            client.join(30)
            for sock in opened:
                sock.close()
    print(
        f"served at {served}, last closed at {last_closed:.1f} s; lifetimes "
        f"{sorted(round(t, 1) for t in lifetimes)}; answers {sorted(set(answers))}"
    )
    assert not opened, f"{len(opened)} sign-ins still open after 20 s"
    assert max(lifetimes) < 10.0, sorted(lifetimes)[-5:]  # 3 s, on a loaded machine
    assert sum(answer.startswith(b"HTTP/1.1 408") for answer in answers) <= 8, answers
    assert served and served[0] < last_closed, (served, last_closed)


def test_slow_headers_from_many_addresses_cannot_fill_the_server(onnx_gallery):
    """48 connections from four addresses that never finish their headers, on a server that
    allows 32 in all: past --max-unauthenticated (8) waiting, the one waiting longest is
    closed, so a client at a fifth address is served at once (before: they held every
    connection until the 10 s header timeout, and it got 503)."""
    options = {"max_connections": 32, "max_unauthenticated": 8}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        address = address_of(url)
        slow = []
        try:
            for n in range(48):
                sock = connect_from(f"127.0.{2 + n % 4}.2", address)
                sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                slow.append(sock)
            time.sleep(0.5)
            transport = httpx.HTTPTransport(local_address="127.0.9.2")
            with httpx.Client(transport=transport, timeout=10) as other:
                started = time.monotonic()
                answer = other.get(f"{url.rstrip('/')}/api/health")
                seconds = time.monotonic() - started
            closed = sum(closed_within(sock, 0.5) for sock in slow)
        finally:
            for sock in slow:
                sock.close()
    assert answer.status_code == 200 and seconds < 5, (answer.status_code, seconds)
    assert closed >= 48 - 8 - 1, closed


def test_forged_forwarded_for_does_not_make_a_new_client(onnx_gallery):
    """Wrong keys from 127.0.0.1, each claiming another X-Forwarded-For: one client (its
    socket), slowed and then refused with 429 even with the right key (before: uvicorn took
    each header for a new client, never slowed). Naming the proxy with --forwarded-allow-ips
    makes its header count."""

    def guesses(url: str, count: int) -> list[tuple[int, float]]:
        def guess(n: int) -> tuple[int, float]:
            started = time.monotonic()
            headers = {"X-API-Key": f"guess-{n}", "X-Forwarded-For": f"203.0.113.{n}"}
            status = httpx.get(f"{url}api/items/0", headers=headers, timeout=60).status_code
            return status, time.monotonic() - started

        with ThreadPool(count) as pool:
            return pool.map(guess, range(count))

    with running_page([onnx_gallery.gallery], analyse=False, api_key=KEY) as (url, _):
        answers = guesses(url, 20)
        forged = httpx.get(f"{url}api/items/0", timeout=30,
                           headers={"X-API-Key": KEY, "X-Forwarded-For": "198.51.100.7"})  # fmt: skip
    assert [status for status, _ in answers].count(401) == 20
    assert max(seconds for _, seconds in answers) >= 0.5  # slowed
    assert forged.status_code == 429
    with running_page([onnx_gallery.gallery], analyse=False, api_key=KEY,
                      forwarded_allow_ips="127.0.0.1") as (url, _):  # fmt: skip
        answers = guesses(url, 20)
        believed = httpx.get(f"{url}api/items/0", timeout=30,
                             headers={"X-API-Key": KEY, "X-Forwarded-For": "198.51.100.7"})  # fmt: skip
    assert believed.status_code == 200  # 20 clients, one wrong guess each: none locked out


def test_an_origin_on_another_port_is_another_origin(onnx_gallery):
    """The no-key loopback server: a page at http://localhost:3000 is not this server's origin
    (before: the same host on any port passed, and got credentialed CORS)."""
    with running_page([onnx_gallery.gallery], analyse=False) as (url, _):
        port = address_of(url)[1]
        for origin in ("http://localhost:3000", f"https://localhost:{port}", "http://localhost"):
            cross = httpx.get(f"{url}config", headers={"Origin": origin})
            assert cross.status_code == 403, origin
            assert "access-control-allow-origin" not in cross.headers
            preflight = httpx.options(f"{url}gradio_api/queue/join", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST"})  # fmt: skip
            assert preflight.status_code == 403, origin
        for own in (f"http://localhost:{port}", f"http://127.0.0.1:{port}"):
            assert httpx.get(f"{url}config", headers={"Origin": own}).status_code == 200, own


def _trickled(address: tuple[str, int], head: bytes, limit_s: float) -> tuple[bytes, float]:
    """Send ``head`` (a request's headers and its body's first bytes), then the body a byte
    every 0.1 s: what the server answered and when it closed the connection (``limit_s`` if it
    had not by then)."""
    sock = socket.create_connection(address, timeout=10)
    started, answer = time.monotonic(), b""
    try:
        sock.sendall(head)
        while time.monotonic() - started < limit_s:  # bounded
            ready, _, _ = select.select([sock], [], [], 0.1)
            if ready:
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    return answer, time.monotonic() - started
                answer += data
                continue
            try:
                sock.sendall(b"a")
            except OSError:
                return answer, time.monotonic() - started
        return answer, limit_s
    finally:
        sock.close()


FORM = "multipart/form-data; boundary=XyZ"
PART = b'--XyZ\r\nContent-Disposition: form-data; name="%s"; filename="q.png"\r\n\r\n'
# (method, path, content type, body's start, with the key, the answer's status)
TRICKLED = {
    "rest search": ("POST", "/api/search", FORM, PART % b"image", True, b"408"),
    "queue join": (
        "POST",
        "/gradio_api/queue/join",
        "application/json",
        b'{"data": [',
        True,
        b"408",
    ),  # fmt: skip
    "gradio call": (
        "POST",
        "/gradio_api/call/search",
        "application/json",
        b'{"data": [',
        True,
        b"408",
    ),  # fmt: skip
    "upload": ("POST", "/gradio_api/upload", FORM, PART % b"files", True, b"408"),
    "sign-in": ("POST", "/login", "application/x-www-form-urlencoded", b"key=", False, b"408"),
    "sign-in page": ("GET", "/login", "text/plain", b"", False, b"200"),
    "page config": ("GET", "/config", "text/plain", b"", True, b"200"),
    "open health": ("POST", "/api/health", "text/plain", b"", False, b"405"),
    "no key": ("POST", "/api/search", FORM, PART % b"image", False, b"401"),
}


@pytest.mark.slow
def test_a_trickled_body_is_cut_at_its_total_deadline_on_every_route(onnx_gallery):
    """A body sent a byte every 0.1 s to each kind of route (REST, Gradio's queue, call and
    upload routes, sign-in, routes that read no body, a refusal): each connection is closed
    within the body deadline (2 s here; 6 s allowed on a loaded machine), answered 408 where
    the route reads the body, else with its own answer. The header timeout (30 s here) is not
    what ends them (before: a route that answered without reading the body left its
    connection reading the rest until the next request's header timeout)."""
    options = {"api_key": KEY, "body_timeout": 2.0, "sign_in_timeout": 2.0,
               "header_timeout": 30.0}  # fmt: skip
    results: dict[str, tuple[bytes, float]] = {}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        address = address_of(url)

        def probe(name: str) -> None:
            method, path, kind, start, keyed, _ = TRICKLED[name]
            key = f"X-API-Key: {KEY}\r\n" if keyed else ""
            head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 400\r\n"
                    f"Content-Type: {kind}\r\n{key}\r\n").encode() + start  # fmt: skip
            results[name] = _trickled(address, head, 15.0)

        with ThreadPool(len(TRICKLED)) as pool:
            pool.map(probe, TRICKLED)
    print({name: (answer[:12], round(seconds, 1)) for name, (answer, seconds) in results.items()})
    for name, (answer, seconds) in results.items():
        assert answer.startswith(b"HTTP/1.1 " + TRICKLED[name][-1]), (name, answer[:200])
        assert seconds < 6.0, (name, seconds)
