"""The server's front door: one ASGI middleware, outermost, in front of every route (the page,
Gradio's API, queue, uploads and CORS handling, file routes, the REST API and its docs).

In order, for every request:

- **Who.** The client is its socket's address, or the one a proxy named in
  ``--forwarded-allow-ips`` forwards (nearsight/app/serve/clients.py); it is set on the scope
  for everything after (Gradio, REST, the work gates, the log).
- **Hosts.** A ``Host`` outside the allowed hosts gets 400 and an ``Origin`` that is not the
  server's own (an allowed host on the request's scheme and port) 403
  (nearsight/app/serve/hosts.py: DNS rebinding and cross-site pages).
- **One key, every route.** With an API key set, a request needs it, except ``GET
  /api/health``: API clients send ``X-API-Key: KEY`` or ``Authorization: Bearer KEY``; a
  browser signs in once on a small form and then carries a session cookie that expires
  (nearsight/app/serve/auth.py). The key is checked from the headers, before a byte of the body is
  read. Wrong keys are slowed, then refused with 429, per client.
- **Bounded bodies.** A body longer than ``max_body_bytes`` gets 413: at once from its
  ``Content-Length``, or as soon as a chunked body passes the limit while it streams (the rest
  is never read). A body not all in within ``body_timeout_s`` of its headers gets 408 (a
  total, not a time between reads); an answer given before the whole body is in closes the
  connection (no route holds it for the rest). The sign-in form is read within 4 KB and
  ``sign_in_timeout_s`` in all, at most ``max_unauthenticated`` at once (then 503).
- **Uploads.** Gradio's upload route takes image files only, within a disk budget per client
  and in all (nearsight/app/serve/uploads.py).
- **Operations.** ``/metrics`` (Prometheus, behind the key like the rest) and one access-log
  line per request on stderr: client, method, path without its query, status, milliseconds,
  each field escaped; never a header, a key or a byte of the body.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from nearsight.app.serve.asgi import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    send_body,
    send_html,
    send_json_error,
)
from nearsight.app.serve.auth import (
    API_KEY_HEADER,
    LOGIN_PATH,
    SESSION_COOKIE,
    ApiKeys,
    FailedAttempts,
    Sessions,
    login_page,
    presented_key,
)
from nearsight.app.serve.bodies import (
    BodyRefused,
    closing,
    declares_body,
    header,
    read_small_body,
    stalled,
)
from nearsight.app.serve.clients import (
    TrustedProxies,
    client_of,
    identify_scope,
    identity_of,
    log_field,
    set_identity,
)
from nearsight.app.serve.hosts import AllowedHosts
from nearsight.app.serve.metrics import ServerMetrics
from nearsight.app.serve.uploads import UPLOAD_PATH, UploadBudget, UploadRefused
from nearsight.core.errors import printable

OPEN_PATHS = frozenset({"/api/health"})
METRICS_PATH = "/metrics"
LOGIN_MAX_BYTES = 4096
DEFAULT_BODY_TIMEOUT_S = 30.0  # a whole request body, from its headers to its last byte
DEFAULT_SIGN_IN_TIMEOUT_S = 5.0  # a whole sign-in form
DEFAULT_MAX_UNAUTHENTICATED = 64  # connections waiting without the key (a quarter of 256)
SIGN_IN_SHARES = 8  # one identity reads at most this share of the sign-in slots at once


@dataclass
class GuardSettings:
    """What the guard enforces, and its state across requests (shared by every instance of the
    middleware: Starlette builds a new one whenever the app's middleware stack is rebuilt)."""

    max_body_bytes: int
    hosts: AllowedHosts
    api_key: str | None = None
    sessions: Sessions | None = None
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    metrics: ServerMetrics | None = None
    access_log: bool = True
    attempts: FailedAttempts = field(default_factory=FailedAttempts)
    trusted_proxies: TrustedProxies = field(default_factory=TrustedProxies)
    sign_in_timeout_s: float = DEFAULT_SIGN_IN_TIMEOUT_S
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED
    signing_in: int = 0  # sign-in forms being read now (touched only on the event loop)
    signing_in_by: collections.Counter[str] = field(default_factory=collections.Counter)
    uploads: UploadBudget | None = None  # Gradio's upload route (nearsight/app/serve/uploads.py)
    keys: ApiKeys | None = None  # the named keys (api_key alone: one key, named "key")

    def __post_init__(self) -> None:
        if self.keys is None and self.api_key:
            self.keys = ApiKeys.of(self.api_key)
        if self.keys and self.sessions is None:
            self.sessions = Sessions(self.keys.secret)


class Guard:
    """Wraps ``app``; see the module docstring."""

    def __init__(self, app: ASGIApp, *, settings: GuardSettings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            identify_scope(scope, self.settings.trusted_proxies)
        if scope["type"] == "websocket":
            locked = self.settings.attempts.locked_for(identity_of(scope)) > 0
            if not locked and self._refusal(scope) is None and self._key_state(scope) == "ok":
                await self.app(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500, "logged": False}

        def log() -> None:
            # once, before the last byte of the answer leaves: a client that has its answer
            # finds the line written
            if status["logged"]:
                return
            status["logged"] = True
            seconds = time.perf_counter() - started
            path = scope.get("path", "")
            if self.settings.metrics is not None:
                self.settings.metrics.observe(path, status["code"], seconds)
            if self.settings.access_log:
                who = client_of(scope)
                if scope.get("nearsight.identity", "").startswith("key:"):  # a named key's
                    who = f"{scope['nearsight.key']}@{who}"
                print(f"nearsight: {log_field(who)} "
                      f"{log_field(scope.get('method', '?'), 20)} {log_field(path)} "
                      f"{status['code']} {seconds * 1000:.1f} ms",
                      file=sys.stderr, flush=True)  # fmt: skip

        # an answer given before the body is all in (by a route that reads none of it, or a
        # refusal) closes the connection: the rest is never read, on any route
        body = {"whole": not declares_body(scope)}

        async def tracked_receive() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                body["whole"] = True
            return message

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if not body["whole"]:
                    message = closing(message)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                log()
            await send(message)

        try:
            await self._handle(scope, tracked_receive, counted_send)
        finally:
            log()

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope)
        if refusal is not None:
            await send_json_error(send, *refusal)
            return
        settings = self.settings
        path = scope.get("path", "")
        if settings.keys and path not in OPEN_PATHS:
            wait = settings.attempts.locked_for(identity_of(scope))
            if wait > 0:
                await send_json_error(send, 429, "too many wrong API keys from this address: retry "
                                 f"in {wait:.0f} s", retry_after=int(wait) + 1)  # fmt: skip
                return
            if path == LOGIN_PATH:
                await self._login(scope, receive, send)
                return
            state = self._key_state(scope)
            if state != "ok":
                await self._unauthorized(scope, send, wrong=state == "wrong")
                return
        if path == METRICS_PATH and settings.metrics is not None:
            body, content_type = settings.metrics.render()
            await send_body(send, 200, body, content_type)
            return
        if path == UPLOAD_PATH and scope.get("method") == "POST" and settings.uploads:
            try:
                await settings.uploads.handle(self.app, scope, receive, send, identity_of(scope))
            except UploadRefused as refused:  # plain text, as Gradio's own route answers
                await send_body(send, refused.status, refused.message.encode(),
                            "text/plain; charset=utf-8", refused.retry_after)  # fmt: skip
            return
        length = header(scope, b"content-length")
        if length.isdigit() and int(length) > settings.max_body_bytes:
            await send_json_error(send, 413, self._too_large())
            return
        await self._limited(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """400 for a Host, 403 for an Origin the server does not answer to."""
        hosts = self.settings.hosts
        host = header(scope, b"host")
        if not hosts.allows(host):
            return 400, (f"this server does not answer to the host {printable(host, 100)!r} "
                         "(its --allowed-hosts)")  # fmt: skip
        origin = header(scope, b"origin")
        if origin and not hosts.allows_origin(origin, host, scope.get("scheme", "http")):
            return 403, f"requests from pages of {printable(origin, 100)!r} are not allowed"
        return None

    def _key_state(self, scope: Scope) -> str:
        """ "ok" (no key needed, or the right one), "missing" or "wrong"."""
        settings = self.settings
        if not settings.keys or scope.get("path") in OPEN_PATHS:
            return "ok"
        given = presented_key(scope.get("headers", ()))
        if given:
            name = settings.keys.match(given)
            if name is None:
                return "wrong"
            _holder(scope, name, settings.keys)
            return "ok"
        cookie = _cookie(scope, SESSION_COOKIE)
        if cookie and settings.sessions is not None:
            name = settings.sessions.holder(cookie)
            if name is not None and name in settings.keys.keys:
                _holder(scope, name, settings.keys)
                return "ok"
        return "missing"

    async def _unauthorized(self, scope: Scope, send: Send, *, wrong: bool) -> None:
        if wrong:
            await self._failed(scope)
        if scope.get("method") == "GET" and "text/html" in header(scope, b"accept"):
            await send_html(send, 401, login_page())
        else:
            await send_json_error(send, 401, f"missing or wrong API key (send it in the "
                             f"{API_KEY_HEADER} header or as Authorization: Bearer)")  # fmt: skip

    async def _failed(self, scope: Scope) -> None:
        """Count a wrong key and hold the answer back as long as the count says."""
        attempts, client = self.settings.attempts, identity_of(scope)
        delay = attempts.failed(client)
        if attempts.count(client) == attempts.lock_after:
            print(f"nearsight: {attempts.lock_after} wrong API keys from {log_field(client)} "
                  f"within {attempts.window_s:g} s: refusing it for a while",
                  file=sys.stderr, flush=True)  # fmt: skip
        if delay > 0:
            await asyncio.sleep(delay)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            await send_html(send, 200, login_page())
            return
        settings = self.settings
        who = identity_of(scope)
        share = max(1, settings.max_unauthenticated // SIGN_IN_SHARES)
        if settings.signing_in >= settings.max_unauthenticated:
            await send_json_error(send, 503, "too many sign-ins at once: retry", retry_after=1)
            return
        if settings.signing_in_by[who] >= share:  # one network cannot take every slot
            await send_json_error(send, 429, f"too many sign-ins at once from your network (at most "
                             f"{share}): retry", retry_after=1)  # fmt: skip
            return
        settings.signing_in += 1
        settings.signing_in_by[who] += 1
        try:
            body = await read_small_body(scope, receive, LOGIN_MAX_BYTES,
                                          settings.sign_in_timeout_s)  # fmt: skip
        except BodyRefused as refused:
            await send_json_error(send, refused.status, refused.message)
            return
        finally:
            settings.signing_in -= 1
            settings.signing_in_by[who] -= 1
            if settings.signing_in_by[who] <= 0:
                del settings.signing_in_by[who]
        given = parse_qs(body.decode("utf-8", "replace")).get("key", [""])[0]
        sessions, keys = self.settings.sessions, self.settings.keys
        name = keys.match(given) if keys else None
        if sessions is None or name is None:
            await self._failed(scope)
            await send_html(send, 401, login_page("wrong key"))
            return
        token = sessions.issue(name=name)
        cookie = sessions.set_cookie(token, https=scope.get("scheme") == "https")
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode()),
                                (b"content-length", b"0")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with the body counted as it streams; past the limit the app is told the
        client left, its own reply is dropped, and the client gets 413."""
        settings = self.settings
        state = {"received": 0, "refused": 0, "started": False, "whole": False}
        deadline = time.monotonic() + settings.body_timeout_s

        async def limited_receive() -> Message:
            if state["refused"]:
                return {"type": "http.disconnect"}
            if state["whole"]:  # the body is in: what is left is waiting for a disconnect
                return await receive()
            try:  # the body's deadline is a total, counted from its headers
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                # asyncio.timeout, not wait_for: no task and no extra loop turns per chunk
                async with asyncio.timeout(left):
                    message = await receive()
            except TimeoutError:
                state["refused"] = 408
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > settings.max_body_bytes:
                    state["refused"] = 413
                    return {"type": "http.disconnect"}
                state["whole"] = not message.get("more_body")
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
                await send_json_error(send, 413, self._too_large())
            else:
                await send_json_error(send, 408, stalled(settings.body_timeout_s))

    def _too_large(self) -> str:
        return (f"the request body is larger than the server's limit "
                f"({self.settings.max_body_bytes} bytes)")  # fmt: skip


def _holder(scope: Scope, name: str, keys: ApiKeys) -> None:
    """The request comes from the holder of the key ``name``: with named keys, that is its
    identity from here on (the fair shares, the log), wherever it connects from."""
    scope["nearsight.key"] = name
    if keys.named:
        set_identity(scope, f"key:{name}")


def _cookie(scope: Scope, name: str) -> str:
    for part in header(scope, b"cookie").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""
