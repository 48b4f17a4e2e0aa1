"""The ASGI shapes the server's middleware speaks (one home for the types), and the small
answers it gives itself before any route runs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_body(
    send: Send, status: int, body: bytes, content_type: str, retry_after: int | None = None
) -> None:
    """One whole answer; an error closes its connection (its request body may be unread, and
    draining it for keep-alive would be work for the client that sent too much)."""
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if status >= 400:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json_error(
    send: Send, status: int, message: str, retry_after: int | None = None
) -> None:
    """``{"error": message}``, the REST API's error shape."""
    await send_body(send, status, json.dumps({"error": message}).encode(), "application/json",
                    retry_after)  # fmt: skip


async def send_html(send: Send, status: int, page: str) -> None:
    await send_body(send, status, page.encode(), "text/html; charset=utf-8")
