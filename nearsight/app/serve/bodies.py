"""Request bodies as the guard (nearsight/app/serve/guard.py) reads them: a small one (the
sign-in form) within a size and a total deadline, and an answer that closes its connection
when it is given before the body is all in."""

from __future__ import annotations

import asyncio
import time

from nearsight.app.serve.asgi import Message, Receive, Scope


class BodyRefused(Exception):
    """An HTTP status and a one-line message for a body not taken."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


async def read_small_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole body of a small request: 413 past ``limit`` bytes (from the Content-Length
    before reading, else while reading), 408 unless all of it is in within ``timeout_s``."""
    length = header(scope, b"content-length")
    if length.isdigit() and int(length) > limit:
        raise BodyRefused(413, "the sign-in form is too large")
    body = b""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            message = await asyncio.wait_for(receive(), deadline - time.monotonic())
        except TimeoutError:
            raise BodyRefused(408, stalled(timeout_s)) from None
        if message["type"] != "http.request":
            raise BodyRefused(400, "the client left before sending the form")
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyRefused(413, "the sign-in form is too large")
        if not message.get("more_body"):
            return body


def declares_body(scope: Scope) -> bool:
    """Whether a request says it has a body (a Content-Length over 0, or chunked)."""
    length = header(scope, b"content-length")
    return (length.isdigit() and int(length) > 0) or bool(header(scope, b"transfer-encoding"))


def closing(start: Message) -> Message:
    """``start`` (an http.response.start) with ``Connection: close``."""
    headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


def stalled(seconds: float) -> str:
    """The 408's message."""
    return f"the request body did not arrive within {seconds:g} s"


def header(scope: Scope, name: bytes) -> str:
    """A request header's value ("" when it has none)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""
