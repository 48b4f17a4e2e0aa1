"""The server's front door: one ASGI middleware in front of every route (the page, Gradio's API,
queue and uploads, file routes, the REST API and its docs).

- **One key, every route.** With an API key set, a request needs it, except ``GET
  /api/health``: API clients send ``X-API-Key: KEY`` or ``Authorization: Bearer KEY``
  (``gradio_client.Client(url, headers={"X-API-Key": KEY})``); a browser signs in once on a
  small form and then carries a session cookie (an HMAC of the key, HttpOnly, SameSite=Strict).
  The key is checked from the headers, before a byte of the body is read.
- **Bounded bodies.** A body longer than ``max_body_bytes`` gets 413: at once from its
  ``Content-Length``, or as soon as a chunked body passes the limit while it streams (the rest
  is never read). A body that stalls for ``body_timeout_s`` between chunks gets 408.
- **Operations.** ``/metrics`` (Prometheus, behind the key like the rest) and one access-log
  line per request: method, path without its query, status, milliseconds; never a header, a
  key or a byte of the body.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from nearsight.app.metrics import ServerMetrics

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_KEY_HEADER = "x-api-key"
SESSION_COOKIE = "nearsight_session"
OPEN_PATHS = frozenset({"/api/health"})
# Gradio's launch() calls this on its own server once; it runs the startup events (idempotent)
LOOPBACK_ONLY_PATHS = frozenset({"/gradio_api/startup-events"})
LOOPBACK = ("127.0.0.1", "::1")
LOGIN_PATH = "/login"
METRICS_PATH = "/metrics"
LOGIN_MAX_BYTES = 4096
DEFAULT_BODY_TIMEOUT_S = 30.0


class BodyTooLarge(Exception):
    pass


class Guard:
    """Wraps ``app``; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        max_body_bytes: int,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        metrics: ServerMetrics | None = None,
        access_log: bool = True,
    ):
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.metrics = metrics
        self.access_log = access_log
        self._session = session_token(api_key) if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not self._allowed(scope):
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, counted_send)
        finally:
            seconds = time.perf_counter() - started
            path = scope.get("path", "")
            if self.metrics is not None:
                self.metrics.observe(path, status["code"], seconds)
            if self.access_log:
                print(f"nearsight: {scope.get('method', '?')} {path[:200]} {status['code']} "
                      f"{seconds * 1000:.1f} ms", file=sys.stderr, flush=True)  # fmt: skip

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if self.api_key and path == LOGIN_PATH:
            await self._login(scope, receive, send)
            return
        if not self._allowed(scope):
            if scope.get("method") == "GET" and "text/html" in _header(scope, b"accept"):
                await _send_html(send, 401, login_page())
            else:
                await _send_json(send, 401, "missing or wrong API key (send it in the X-API-Key "
                                 "header or as Authorization: Bearer)")  # fmt: skip
            return
        if path == METRICS_PATH and self.metrics is not None:
            body, content_type = self.metrics.render()
            await _send(send, 200, body, content_type)
            return
        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _send_json(send, 413, self._too_large())
            return
        await self._limited(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with the body counted as it streams; past the limit the app is told the
        client left, its own reply is dropped, and the client gets 413."""
        state = {"received": 0, "refused": 0, "started": False}

        async def limited_receive() -> Message:
            if state["refused"]:
                return {"type": "http.disconnect"}
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except TimeoutError:
                state["refused"] = 408
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_body_bytes:
                    state["refused"] = 413
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if state["refused"]:
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not state["refused"]:
                raise
        if state["refused"] and not state["started"]:
            if state["refused"] == 413:
                await _send_json(send, 413, self._too_large())
            else:
                await _send_json(send, 408, f"the request body stalled for {self.body_timeout_s:g} s")

    def _too_large(self) -> str:
        return f"the request body is larger than the server's limit ({self.max_body_bytes} bytes)"

    def _allowed(self, scope: Scope) -> bool:
        if not self.api_key or scope.get("path") in OPEN_PATHS:
            return True
        client = (scope.get("client") or ("", 0))[0]
        if scope.get("path") in LOOPBACK_ONLY_PATHS and client in LOOPBACK:
            return True
        given = _header(scope, b"x-api-key")
        if not given:
            bearer = _header(scope, b"authorization")
            if bearer.lower().startswith("bearer "):
                given = bearer[7:].strip()
        if given:
            return hmac.compare_digest(given.encode(), self.api_key.encode())
        cookie = _cookie(scope, SESSION_COOKIE)
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self._session.encode())

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            await _send_html(send, 200, login_page())
            return
        body = b""
        while True:
            message = await asyncio.wait_for(receive(), self.body_timeout_s)
            body += message.get("body", b"")
            if len(body) > LOGIN_MAX_BYTES:
                await _send_json(send, 413, "the sign-in form is too large")
                return
            if not message.get("more_body"):
                break
        given = parse_qs(body.decode("utf-8", "replace")).get("key", [""])[0]
        if not hmac.compare_digest(given.encode(), (self.api_key or "").encode()):
            await _send_html(send, 401, login_page("wrong key"))
            return
        cookie = (f"{SESSION_COOKIE}={self._session}; Path=/; HttpOnly; SameSite=Strict")
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode()),
                                (b"content-length", b"0")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})


def session_token(api_key: str) -> str:
    """The browser's session cookie: derived from the key, so it changes with it."""
    return hmac.new(api_key.encode(), b"nearsight-session", hashlib.sha256).hexdigest()


def login_page(message: str = "") -> str:
    note = f"<p style='color:#dc2626'>{html.escape(message)}</p>" if message else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>nearsight: sign in</title>"
        "</head><body style='font-family:sans-serif;max-width:24rem;margin:4rem auto'>"
        "<h2>nearsight</h2><p>This server needs its API key.</p>" + note +
        f"<form method='post' action='{LOGIN_PATH}'><input type='password' name='key' "
        "autofocus style='width:100%'><p><button type='submit'>Sign in</button></p></form>"
        "</body></html>"
    )  # fmt: skip


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


def _cookie(scope: Scope, name: str) -> str:
    for part in _header(scope, b"cookie").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


async def _send(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    if status >= 400:  # the body may be unread: close rather than drain it for keep-alive
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, message: str) -> None:
    await _send(send, status, json.dumps({"error": message}).encode(), "application/json")


async def _send_html(send: Send, status: int, page: str) -> None:
    await _send(send, status, page.encode(), "text/html; charset=utf-8")
